"""Per-platform engine defaults: the table by target family, the cached platform lookup (stood in for
by monkeypatching the platform and clearing the cache), configs that take or override the defaults,
and the warm-up plan tracing exactly the decode sizes a target captures."""

import dataclasses
import re
from pathlib import Path

import pytest
from tritonwarm.engine import platform_defaults as pd
from tritonwarm.engine.config import ENGINES, engine_config_from_dict
from tritonwarm.engine.plan import engine_plan, representative_steps
from tritonwarm.jit import TARGETS
from tritonwarm.jit.core.targets import Target

TINY = ENGINES["tiny"]
WIDE = dataclasses.replace(TINY, max_batch_size=1024, max_num_tokens=1024)  # past every capture limit
DECODE = re.compile(r"decode tokens=(\d+) batch=\1$")


@pytest.fixture
def platform(monkeypatch):
    """``platform(name)``: this process sees ``name``'s GPU (None: no GPU) until the test ends."""
    asked = []

    def stand_in(name):
        monkeypatch.setattr(pd, "local_target", lambda: asked.append(name) or (TARGETS[name] if name else None))
        pd.clear_platform_cache()
        return asked

    yield stand_in
    monkeypatch.undo()
    pd.clear_platform_cache()  # the next test asks the real platform again


def test_every_target_has_a_row_of_its_family():
    for target in TARGETS.values():
        row = pd.platform_defaults(target)
        assert row.family == target.family and pd.FAMILY_DEFAULTS[target.family] is row
    assert {t.family for t in TARGETS.values()} == set(pd.FAMILY_DEFAULTS)
    unknown = Target("sm75", "cuda", 75, 32)
    assert pd.platform_defaults(unknown) is pd.OTHER_GPU_DEFAULTS
    with pytest.raises(dataclasses.FrozenInstanceError):
        pd.FAMILY_DEFAULTS["hopper"].max_capture_size = 4096
    with pytest.raises(TypeError):
        pd.FAMILY_DEFAULTS["hopper"] = pd.OTHER_GPU_DEFAULTS


@pytest.mark.parametrize("name, limit", [("sm80", 256), ("sm90", 512), ("sm100", 1024), ("sm120", 256),
                                         ("gfx90a", 256), ("gfx942", 512), ("gfx950", 512)])
def test_capture_limits_by_generation(name, limit):
    sizes = pd.platform_defaults(TARGETS[name]).capture_sizes
    assert sizes[:4] == (1, 2, 4, 8) and sizes[-1] == limit and list(sizes) == sorted(set(sizes))
    gaps = [(a, b - a) for a, b in zip(sizes, sizes[1:], strict=False)]
    assert all(gap == (8 if a < 256 else 16) for a, gap in gaps if a >= 8)


def test_blackwell_captures_larger_decode_batches_than_hopper_ampere_and_amd():
    limit = {name: pd.platform_defaults(t).max_capture_size for name, t in TARGETS.items()}
    assert limit["sm100"] == limit["sm103"] > max(v for k, v in limit.items() if TARGETS[k].family != "blackwell")
    assert pd.capture_sizes(WIDE, TARGETS["sm100"])[-1] == 1024
    assert pd.capture_sizes(WIDE, TARGETS["sm90"])[-1] == pd.capture_sizes(WIDE, TARGETS["gfx942"])[-1] == 512


def test_the_platform_is_asked_once_and_a_test_can_stand_in_another(platform):
    asked = platform("sm100")
    assert pd.platform_defaults().family == "blackwell"
    assert pd.capture_sizes(WIDE)[-1] == 1024 and pd.capture_sizes(TINY) == (1, 2, 4)
    assert pd.platform_defaults().family == "blackwell" and asked == ["sm100"]  # cached
    platform("sm90")
    assert pd.capture_sizes(WIDE)[-1] == 512
    platform("gfx942")
    assert pd.platform_defaults().family == "cdna3" and pd.capture_sizes(WIDE)[-1] == 512
    platform(None)  # no GPU: nothing to capture
    assert pd.platform_defaults() is pd.CPU_DEFAULTS and pd.capture_sizes(WIDE) == ()
    assert pd.for_target(WIDE).cuda_graph_batch_sizes == ()


def test_presets_take_the_defaults_and_a_config_can_set_its_own(platform):
    platform("sm100")
    lite = ENGINES["deepseek-v2-lite"]
    assert TINY.cuda_graph_batch_sizes is None and lite.cuda_graph_batch_sizes is None
    assert pd.capture_sizes(lite) == (1, 2, 4, 8, 16, 24, 32)  # the ladder up to its 32-request limit
    # A batch limit between two ladder sizes gets a graph of its own: the fullest decode replays one.
    assert pd.capture_sizes(dataclasses.replace(TINY, max_batch_size=12, max_num_tokens=32)) == (1, 2, 4, 8, 12)
    own = engine_config_from_dict({"preset": "tiny", "cuda_graph_batch_sizes": [3, 1]})
    none = engine_config_from_dict({"preset": "tiny", "cuda_graph_batch_sizes": []})
    default = engine_config_from_dict({"preset": "tiny", "max_batch_size": 2, "cuda_graph_batch_sizes": None})
    for target in (None, TARGETS["sm90"], TARGETS["sm100"], TARGETS["gfx942"]):
        assert pd.capture_sizes(own, target) == (1, 3) and pd.capture_sizes(none, target) == ()
        assert pd.capture_sizes(default, target) == (1, 2)
        assert pd.for_target(own, target) is own


def _decode_sizes(labels) -> set[int]:
    return {int(m.group(1)) for label in labels if (m := DECODE.search(label))}


@pytest.mark.parametrize("name", ["sm90", "sm100", "gfx942"])
def test_the_plan_traces_exactly_the_decode_sizes_its_target_captures(name):
    target = TARGETS[name]
    sizes = pd.capture_sizes(WIDE, target)
    # the decode steps a config without graphs traces anyway: one per Triton class of the batch size
    no_graphs = dataclasses.replace(WIDE, cuda_graph_batch_sizes=())
    classes = _decode_sizes(label for label, _ in representative_steps(no_graphs))
    assert len(classes) < 5
    the_plan = engine_plan(WIDE, target)
    assert not the_plan.errors
    traced = _decode_sizes(row.split(" ", 1)[1] for v in the_plan.variants.values() for row in v.rows)
    assert traced == set(sizes) | classes
    assert max(traced) == pd.platform_defaults(target).max_capture_size


def test_the_python_example_of_docs_scheduling_runs(capsys):
    page = (Path(__file__).resolve().parent.parent / "docs" / "scheduling.md").read_text()
    blocks = re.findall(r"<!-- runnable -->\n```python\n(.*?)```", page, re.S)
    assert blocks
    for block in blocks:
        exec(compile(block, "docs/scheduling.md", "exec"), {})
    assert capsys.readouterr().out == "(1, 2, 4, 8, 16, 24)\n"
