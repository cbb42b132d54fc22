"""Server metrics in the Prometheus text format: gauges read from the engine, counters and latency histograms."""

from bisect import bisect_left
from dataclasses import dataclass, field

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


@dataclass
class Histogram:
    name: str
    help: str
    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; the last is +Inf
    total: float = 0.0

    def __post_init__(self):
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.buckets, value)] += 1
        self.total += value

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        running = 0
        for bound, count in zip((*map(str, self.buckets), "+Inf"), self.counts):
            running += count
            lines.append(f'{self.name}_bucket{{le="{bound}"}} {running}')
        return lines + [f"{self.name}_sum {self.total}", f"{self.name}_count {running}"]


class Metrics:
    """Counters and histograms, written by the engine thread only; gauges are passed in at render time."""

    def __init__(self):
        self.ttft = Histogram("compress_time_to_first_token_seconds", "Time from arrival to the first output token.")
        self.itl = Histogram("compress_inter_token_latency_seconds", "Time between consecutive output tokens of a request.")
        self.e2e = Histogram("compress_e2e_request_latency_seconds", "Time from arrival to the last output token.")
        self.generation_tokens = 0
        self.prompt_tokens = 0
        self.finished: dict[str, int] = {"stop": 0, "length": 0, "abort": 0}

    def render(self, gauges: dict[str, tuple[str, float]], counters: dict[str, tuple[str, float]]) -> str:
        """gauges and counters: name -> (help, value), added to the ones kept here."""
        counters = {
            "compress_generation_tokens_total": ("Output tokens generated.", self.generation_tokens),
            "compress_prompt_tokens_total": ("Prompt tokens of admitted requests.", self.prompt_tokens),
            **counters,
        }
        lines = []
        for kind, table in (("gauge", gauges), ("counter", counters)):
            for name, (help_, value) in table.items():
                lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name} {value}"]
        lines += ["# HELP compress_request_success_total Finished requests by finish reason.",
                  "# TYPE compress_request_success_total counter"]
        lines += [f'compress_request_success_total{{finished_reason="{r}"}} {n}' for r, n in self.finished.items()]
        for hist in (self.ttft, self.itl, self.e2e):
            lines += hist.render()
        return "\n".join(lines) + "\n"
