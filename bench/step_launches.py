"""One training step on a GPU, eager against captured and replayed: its time, its launches,
and the card's busy share — the ``capture`` section of ``bench_gpu_host.py``.

A step of ``--preset`` (default ``mixer_cifar``) on random data of its input shape, batch
``--batch`` (the recipe's 64), AdamW as :func:`models.train` builds it on a GPU
(:func:`models.step_capture.optimizer`): eager (forward, loss, backward, step, as every step ran
before issue 46) and through :class:`models.step_capture.TrainingStep` (warm-up steps, then the
captured step replayed). For each: the median milliseconds per step over ``steps`` steps after
a warm-up (the two modes' steps in turns, the card synchronised around each:
:func:`harness.interleaved`), and from one profiled run of ``steps`` steps
(``torch.profiler``, CPU and CUDA) the launches per step (the host's ``cudaLaunchKernel`` and
``cudaGraphLaunch`` calls and their driver twins) and the busy share (the kernels' summed time
on the card over the steps' wall time). Without CUDA it says so and measures nothing.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import harness  # bench/harness.py, beside this script
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import models
from models.connections import input_spec
from models.devices import placement
from models.step_capture import WARMUP_STEPS, TrainingStep, optimizer

LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "cuGraphLaunch")


def _runner(preset: str, batch: int, device: torch.device, captured: bool) -> Any:
    torch.manual_seed(0)
    model = models.create(preset).to(device).train()
    place = placement(str(device))
    opt = optimizer(model, 1e-3, 0.05, place)
    shape = tuple(input_spec(model).shape)
    x = torch.rand(batch, *shape, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    if captured:
        step = TrainingStep(model, opt, place, batch)
        return lambda: step(x, y), step

    def eager() -> None:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return eager, None


def _profiled(run: Any, steps: int, device: torch.device) -> tuple[float, float | None]:
    """(launches per step, busy share) of ``steps`` steps under the profiler."""
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        began = time.perf_counter()
        for _ in range(steps):
            run()
        torch.cuda.synchronize(device)
        wall = time.perf_counter() - began
    launches = busy = 0.0
    for event in prof.key_averages():
        if any(name in event.key for name in LAUNCHES):
            launches += event.count
    for event in prof.events():
        if str(event.device_type).endswith("CUDA"):
            busy += getattr(event, "device_time", 0.0) or 0.0  # microseconds
    share = busy / 1e6 / wall if busy else None  # a graph's kernels may go unseen
    return launches / steps, share


def step_capture(device: torch.device, preset: str, batch: int, steps: int) -> dict[str, Any]:
    """The figures of the module docstring, or why none were measured."""
    if device.type != "cuda":
        return {"skipped": "needs a CUDA device: capture is for GPU steps"}
    runners = {}
    for captured in (False, True):
        run, step = _runner(preset, batch, device, captured)
        for _ in range(WARMUP_STEPS + 2):  # the captured one records its graph here
            run()
        runners["captured" if captured else "eager"] = run, step
    sync = partial(torch.cuda.synchronize, device)
    jobs = {mode: run for mode, (run, _) in runners.items()}
    timed = harness.interleaved(jobs, steps, warm_up=False, sync=sync)
    rows = []
    for mode, (run, step) in runners.items():
        launches, share = _profiled(run, steps, device)
        rows.append(
            {
                "mode": mode,
                "ms_per_step": timed[mode].stat("wall") * 1000,
                "launches_per_step": launches,
                "busy_share": share,
                "step_capture": step.record if step is not None else "eager",
            }
        )
    return {"preset": preset, "batch": batch, "steps": steps, "rows": rows}


def table_lines(figures: dict[str, Any], card: str) -> list[str]:
    """The section as markdown lines."""
    if "rows" not in figures:
        return []
    head = f"## One training step of {figures['preset']} (batch {figures['batch']}) on {card}"
    lines = ["", head, "", "| step | ms per step | launches per step | card busy | how |"]
    lines += ["|---|---:|---:|---:|---|"]
    for r in figures["rows"]:
        share = "–" if r["busy_share"] is None else f"{r['busy_share']:.0%}"
        lines.append(
            f"| {r['mode']} | {r['ms_per_step']:.2f} | {r['launches_per_step']:.0f} | {share} "
            f"| {r['step_capture']} |"
        )
    return lines
