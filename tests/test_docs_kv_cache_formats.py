"""docs/kv-cache-formats.md: its Python runs, its configs load, its shell command prints the line the
page shows, and its bytes-per-token table is what the engine computes."""

import re
import shlex
from pathlib import Path

import pytest
from tritonwarm.engine.config import engine_config_from_dict, load_engine_config
from tritonwarm.engine.kv import kv_cache_bytes_per_token, kv_cache_tokens

PAGE = Path(__file__).resolve().parents[1] / "docs" / "kv-cache-formats.md"


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", PAGE.read_text(), flags=re.S)


def test_python_examples_run():
    blocks = _blocks("python")
    assert blocks
    for code in blocks:
        exec(compile(code, str(PAGE), "exec"), {})


def test_bytes_per_token_table_is_what_the_engine_computes():
    rows = re.findall(r"^\| `(\w+)`[^|]*\| (\d+) \| (\d+) \| (\d+) \| ([\d.]+)x \|$", PAGE.read_text(), flags=re.M)
    assert [r[0] for r in rows] == ["auto", "fp8_ds_mla", "nvfp4_ds_mla"]
    base = None
    for name, per_layer, per_token, tokens, ratio in rows:
        config = engine_config_from_dict({"preset": "deepseek-v2-lite", "kv_cache_dtype": name})
        assert kv_cache_bytes_per_token(config) == int(per_token) == 27 * int(per_layer)
        assert kv_cache_tokens(config, 80 * 2**30) == int(tokens)
        base = base or int(tokens)
        assert f"{int(tokens) / base:.2f}" == ratio


def test_configs_load_and_the_shell_example_prints_the_pages_line(tmp_path, monkeypatch, engine_cli, capsys):
    first, tiny = _blocks("yaml")
    (tmp_path / "engine.yaml").write_text(first)
    assert load_engine_config(tmp_path / "engine.yaml").kv_cache_dtype == "fp8_ds_mla"
    (tmp_path / "tiny-fp8.yaml").write_text(tiny)
    monkeypatch.chdir(tmp_path)
    [command] = _blocks("sh")
    argv = shlex.split(command)
    assert argv[0] == "tritonwarm"
    assert engine_cli(argv[1:]) == 0
    [expected] = _blocks("text")
    assert capsys.readouterr().out.splitlines()[-1] == expected.strip()


@pytest.mark.parametrize("name", ["fp8_ds_mla", "nvfp4_ds_mla"])
def test_layout_tables_match_the_formats(name):
    from tritonwarm.launchers.kv_cache_formats import kv_format

    text = PAGE.read_text().split(f"`{name}`: ", 1)[1].split("\n\n", 2)[1]
    ranges = [tuple(int(x) for x in m) for m in re.findall(r"^\| (\d+)-(\d+) \|", text, flags=re.M)]
    fields = sorted(kv_format(name).fields().values())
    assert ranges == [(start, stop - 1) for start, stop in fields]
