"""Does inductor (``torch.compile``) make a CPU training step faster, once it has compiled?

Issue 46 captures a GPU training step to save its kernel launches; on the host there are no
launches to save, but inductor fuses the elementwise work of a step. This times ``--steps``
training steps (forward, loss, backward, AdamW as :func:`models.train` builds it) of each
preset, eager against ``torch.compile`` of the model (default mode, inductor), interleaved
after an untimed warm-up that compiles (:mod:`harness`); the compile time is reported apart.
Random data of the preset's input shape, batch ``--batch``. A speedup below 1 keeps the host
eager (:mod:`models.step_capture`).

    PYTHONPATH=. python bench/bench_cpu_compile.py --threads 2
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from harness import finish, interleaved, options, parse, table  # bench/harness.py, beside this

import models
from models.connections import input_spec
from models.devices import placement
from models.step_capture import optimizer


def stepper(preset: str, batch: int, steps: int, compiled: bool) -> tuple[Callable[[], Any], float]:
    """A job of ``steps`` training steps of ``preset``, and the seconds its first step took
    (with compiling, for the compiled one)."""
    torch.manual_seed(0)
    model = models.create(preset)
    shape = tuple(input_spec(model).shape)
    x, y = torch.rand(batch, *shape), torch.randint(0, 10, (batch,))
    opt = optimizer(model, 1e-3, 0.05, placement("cpu"))
    net: Any = torch.compile(model) if compiled else model

    def one() -> float:
        loss = F.cross_entropy(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return float(loss.detach())

    began = time.perf_counter()
    one()
    first = time.perf_counter() - began
    return (lambda: [one() for _ in range(steps)]), first


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="+", default=["mixer_digits", "mixer_cifar"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10, help="training steps per timed run")
    options(ap, repeat=5)
    args = parse(ap)
    figures: dict[str, Any] = {}
    for preset in args.presets:
        eager, eager_first = stepper(preset, args.batch, args.steps, compiled=False)
        fused, compile_s = stepper(preset, args.batch, args.steps, compiled=True)
        timed = interleaved({"eager": eager, "inductor": fused}, args.repeat)
        title = f"{preset}: {args.steps} steps of {args.batch}"
        print(table(title, timed, args.clock, base="eager"))
        speedup = timed["eager"].stat(args.clock) / timed["inductor"].stat(args.clock)
        print(f"first step: eager {eager_first:.2f} s, inductor (compiling) {compile_s:.1f} s")
        print(f"inductor speedup after compiling: {speedup:.2f}×\n")
        figures[preset] = {"speedup": round(speedup, 3), "compile_s": round(compile_s, 1)}
    finish(args.json, {"presets": figures})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
