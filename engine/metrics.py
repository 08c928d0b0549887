"""The counters a service exports about compiles and scheduling, in Prometheus' text format.

A registry of its own (never the process-global one), so several engines, or tests, never mix
their counts.
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

# Preemptions per finished request: 0 has a bucket of its own (most requests are never preempted),
# then a 1-2-5 series; +Inf is added by the client. Sorted, unique, finite bounds: what exporters accept.
PREEMPTION_BUCKETS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500)


class EngineMetrics:
    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.serve_compiles = Counter("tritonwarm_serve_compiles", "Kernel compiles and C launcher builds at "
                                      "serving time (on a dry run: variants that would compile)", registry=r)
        self.serve_c_builds = Counter("tritonwarm_serve_c_builds", "C modules (launchers, driver utilities) "
                                      "Triton built at serving time (counted in serve_compiles too)", registry=r)
        self.serve_compile_seconds = Counter("tritonwarm_serve_compile_seconds",
                                             "Seconds spent compiling at serving time", registry=r)
        self.cache_hits = Counter("tritonwarm_cache_hits", "Variants served from the warmed cache", registry=r)
        self.cache_misses = Counter("tritonwarm_cache_misses", "Variants the warmed cache lacked", registry=r)
        self.launches = Counter("tritonwarm_kernel_launches", "Kernel launches", ["kernel"], registry=r)
        self.steps = Counter("tritonwarm_engine_steps", "Engine steps", registry=r)
        self.tokens = Counter("tritonwarm_engine_generated_tokens", "Tokens generated", registry=r)
        self.preemptions = Counter("tritonwarm_engine_preemptions", "Preemption events: a running request's "
                                   "KV freed to make room, recomputed on readmission", registry=r)
        self.request_preemptions = Histogram("tritonwarm_request_preemptions", "Preemptions of each finished "
                                             "request", buckets=PREEMPTION_BUCKETS, registry=r)

    def observe(self, report) -> None:
        """Add one finished run (a ``runner.ServeReport``)."""
        monitor = report.monitor
        self.serve_compiles.inc(report.serve_compiles)
        self.serve_compile_seconds.inc(monitor.compile_seconds)
        self.serve_c_builds.inc(len(monitor.c_builds))
        self.cache_hits.inc(monitor.hits)
        self.cache_misses.inc(len(monitor.misses))
        for kernel, count in sorted(monitor.launches.items()):
            self.launches.labels(kernel=kernel.rsplit(".", 1)[-1]).inc(count)
        self.steps.inc(report.result.steps)
        self.tokens.inc(report.result.generated_tokens)
        self.preemptions.inc(report.result.preemptions)
        for count in report.result.request_preemptions:
            self.request_preemptions.observe(count)

    def text(self) -> str:
        return generate_latest(self.registry).decode()

    def write(self, path: str | Path) -> None:
        Path(path).write_text(self.text())
