"""The training curve of one or more runs as a PNG: loss and held-out tau against training hours.

    python -m sglang_dspark.training curve --run RUN [RUN ...] --out curve.png

Left: the training loss (every logged step, and its moving average) against the run's cumulative step time.
Right: tau from ``evaluate --run`` (greedy rounds replayed on held-out caches, one line per cache) against the same
axis, which is what decides whether more training hours still pay. A run started with ``--init-from`` is drawn from
that draft's own training time when ``--offset-hours`` says how long it was.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence


def read_jsonl(path: Path) -> List[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def moving_average(values: Sequence[float], window: int) -> List[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def held_out_series(evaluations: List[dict]) -> Dict[str, List[tuple]]:
    """cache folder name -> [(train hours, tau)] sorted by time (rows of whole-vocab or Markov-off runs apart)."""
    series: Dict[str, List[tuple]] = {}
    for r in evaluations:
        if r.get("train_seconds") is None:
            continue
        name = Path(r["cache"]).name + ("" if r.get("markov", True) else ", no Markov")
        series.setdefault(name, []).append((r["train_seconds"] / 3600.0, r["tau"]))
    return {k: sorted(v) for k, v in series.items()}


def plot_runs(runs: Sequence[Path], out: Path, offsets_hours: Optional[Sequence[float]] = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_loss, ax_tau) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, run in enumerate(runs):
        offset = offsets_hours[i] if offsets_hours and i < len(offsets_hours) else 0.0
        log = [r for r in read_jsonl(Path(run) / "train_log.jsonl") if "train_seconds" in r]
        if log:
            hours = [offset + r["train_seconds"] / 3600.0 for r in log]
            loss = [r["loss"] for r in log]
            ax_loss.plot(hours, loss, alpha=0.25, linewidth=0.8)
            ax_loss.plot(hours, moving_average(loss, 10), label=Path(run).name)
        for name, points in held_out_series(read_jsonl(Path(run) / "evaluations.jsonl")).items():
            ax_tau.plot([offset + h for h, _ in points], [t for _, t in points], marker="o",
                        label=f"{Path(run).name}: {name}")
    ax_loss.set_xlabel("training hours (2 CPU cores)")
    ax_loss.set_ylabel("loss (0.1 CE + 0.9 L1 + conf)")
    ax_loss.set_title("training loss")
    ax_loss.legend(fontsize=8)
    ax_tau.set_xlabel("training hours (2 CPU cores)")
    ax_tau.set_ylabel("tau (greedy replay, bonus token counted)")
    ax_tau.set_title("held-out acceptance length")
    ax_tau.legend(fontsize=8)
    for ax in (ax_loss, ax_tau):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
