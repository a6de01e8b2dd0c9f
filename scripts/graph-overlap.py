#!/usr/bin/env python3
"""Whether consecutive calls of an implementation overlap inside one CUDA graph (the bench's
cold-rotate figure), measured apart from the kernels' own time: for one suite case, a graph of N
calls over two input sets, timed once as is and once with a one-thread kernel between the calls
(which waits for the call before it and holds the next one back, so nothing of two calls can
overlap); the second figure less the separator's own time is the calls' time without overlap.

    PYTHONPATH=. python3 scripts/graph-overlap.py specs/bench/verify_attn_serving.yaml \\
        b32_h8_q4_p4096_mixed_chain --impl cuda --impl flashmla [--define bf16_wgmma2:WG2_LPT=2]

Prints one JSON line an implementation (µs a call: `graph`, `separated`, `separator`, and
`overlap` = separated - separator - graph). With --profile it times nothing: it replays each
implementation's graph 3 times inside an NVTX range `profile`, for a profiler that counts a whole
graph (`ncu --graph-profiling graph --nvtx --nvtx-include profile/ ...`: what a call reads from DRAM
and hits in L2 when the calls run back to back). With --timeline it replays each graph under
torch.profiler and prints, from the kernels' own start and end stamps, each kernel's mean time and
the mean gap between consecutive kernels (negative: the later one started before the earlier one
ended, as a programmatic dependent launch lets it), and a call's span. Run on a GPU machine from
the repo root; peers run in this process (KDTREE_ISOLATE=0 is set here: a graph cannot capture a
worker's calls). Exit 2 on bad usage or no GPU."""

import argparse
import json
import os
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", help="a YAML suite")
    parser.add_argument("case", help="the name of one of its cases (or a glob matching one)")
    parser.add_argument("--impl", action="append", help="as `kdtree bench --impl` names it (default: cuda, "
                        "unless --define is given)")
    parser.add_argument("--define", action="append", default=[], metavar="KERNEL:KNOB=V[,KNOB=V]",
                        help="one of our kernels forced with its knobs, as `kdtree bench --define` takes it")
    parser.add_argument("--calls", type=int, default=10, help="calls a graph (default 10)")
    parser.add_argument("--replays", type=int, default=50, help="timed replays a figure (default 50)")
    parser.add_argument("--profile", action="store_true", help="only replay each graph 3 times in an NVTX "
                        "range `profile` (for ncu --graph-profiling graph)")
    parser.add_argument("--timeline", action="store_true", help="replay each graph under torch.profiler: "
                        "per-kernel times and the gaps between consecutive kernels")
    args = parser.parse_args()
    os.environ["KDTREE_ISOLATE"] = "0"

    import torch

    from kdtr.errors import KdtreeError
    from kdtr.impl.backends import upload
    from kdtr.impl.builds import kernel_builds
    from kdtr.impl.builtin import cuda_build
    from kdtr.impl.resolve import resolve
    from suite_case import one_case

    impls = []
    try:
        for name in args.impl or ([] if args.define else ["cuda"]):
            impls.append((name, resolve(name)))
        for build in kernel_builds([], args.define):
            impls.append((build.label, cuda_build(build.label, build.name, build.defines)))
    except KdtreeError as err:
        print(f"graph-overlap: {err}", file=sys.stderr)
        return 2
    case, op, gen = one_case("graph-overlap", args.suite, args.case)
    tiny = torch.zeros(1, device="cuda")

    stream = torch.cuda.Stream()

    def captured(body):
        """A graph of args.calls calls of body(i), captured on `stream` after two warm-up calls and
        replayed once."""
        for i in range(2):
            body(i)                                       # warm-up outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for i in range(args.calls):
                body(i)
        graph.replay()
        torch.cuda.synchronize()
        return graph

    def timed(body) -> float:
        """µs a call of a graph of args.calls calls of body(i), the median of 5 blocks of replays."""
        with torch.cuda.stream(stream):
            graph = captured(body)
            figures = []
            for _ in range(5):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(args.replays):
                    graph.replay()
                end.record()
                end.synchronize()
                figures.append(start.elapsed_time(end) * 1e3 / (args.replays * args.calls))
        return sorted(figures)[2]

    def profiled(body) -> None:
        """The graph of body(i), replayed 3 times inside the NVTX range `profile`."""
        with torch.cuda.stream(stream):
            graph = captured(body)
            torch.cuda.nvtx.range_push("profile")
            for _ in range(3):
                graph.replay()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()

    def timeline(body) -> dict:
        """Kernel times and gaps of 5 replays of the graph of body(i), from the profiler's trace."""
        import tempfile

        from torch.profiler import ProfilerActivity, profile

        def traced(run) -> list:
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                run()
                torch.cuda.synchronize()
            with tempfile.NamedTemporaryFile(suffix=".json") as trace:
                prof.export_chrome_trace(trace.name)
                events = json.loads(Path(trace.name).read_text())["traceEvents"]
            return sorted((e["ts"], e["ts"] + e["dur"], e["name"][:48]) for e in events
                          if e.get("cat") == "kernel" and e.get("ph") == "X")

        with torch.cuda.stream(stream):
            graph = captured(body)
            kernels, how = traced(lambda: [graph.replay() for _ in range(5)]), "graph"
            if not kernels:                               # a profiler that does not see into graphs
                kernels, how = traced(lambda: [body(i) for i in range(5 * args.calls)]), "stream"
        return {"traced": how, **summary(kernels, 5 * args.calls)}

    def summary(kernels, calls: int) -> dict:
        """Mean µs of each kernel name, mean gap (start of the next less end of this one) of each
        consecutive pair of names, and µs a call over the whole trace."""
        if not kernels:
            return {"kernels": 0}
        times, gaps = {}, {}
        for start, end, name in kernels:
            times.setdefault(name, []).append(end - start)
        for (_, end, a), (start, _, b) in zip(kernels, kernels[1:]):
            gaps.setdefault(f"{a} -> {b}", []).append(start - end)
        mean = lambda xs: round(sum(xs) / len(xs), 2)
        return {"kernels": len(kernels), "per_call": round((kernels[-1][1] - kernels[0][0]) / calls, 2),
                "time": {k: [len(v), mean(v)] for k, v in times.items()},
                "gap": {k: [len(v), mean(v), round(min(v), 2)] for k, v in gaps.items()}}

    separator = 0.0 if args.profile or args.timeline else timed(lambda i: tiny.add_(1))
    for name, impl in impls:
        with torch.no_grad():
            calls = [impl.prepare(op, case.variant, upload(gen.inputs, "cuda"), gen.params) for _ in range(2)]
            if args.profile:
                profiled(lambda i: calls[i % 2]())
                figures = {"profiled": 3}
            elif args.timeline:
                figures = {"gpu": torch.cuda.get_device_name(), "calls": 5 * args.calls,
                           **timeline(lambda i: calls[i % 2]())}
            else:
                plain = timed(lambda i: calls[i % 2]())
                separated = timed(lambda i: (calls[i % 2](), tiny.add_(1)))
                figures = {"gpu": torch.cuda.get_device_name(), "graph": round(plain, 2),
                           "separated": round(separated, 2), "separator": round(separator, 2),
                           "overlap": round(separated - separator - plain, 2)}
        print(json.dumps({"case": case.name, "impl": name, **figures}), flush=True)
        del calls
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
