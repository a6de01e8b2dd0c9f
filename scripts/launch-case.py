#!/usr/bin/env python3
"""Our kernel's launch on one suite case, a few times, for a profiler to capture (the ncu figures of
results/profiles.json):

    ncu --kernel-name regex:verify_attn --launch-count 3 --metrics ... \\
        python3 scripts/launch-case.py specs/bench/verify_attn.yaml b64_h16_q65_p32768
    ncu --kernel-name regex:flash --launch-count 3 --metrics ... \\
        python3 scripts/launch-case.py --impl flashmla specs/bench/verify_attn.yaml b64_h16_q65_p32768
    ncu --kernel-name verify_attn_bf16_mma99 --launch-count 1 --set full \\
        python3 scripts/launch-case.py --define bf16_mma99:M99_SUM_SCATTER=1 SUITE CASE

Run from the repo root with PYTHONPATH=. on a GPU machine. Prints the kernel and grid the launch
picked. Exit 2 on bad usage, a case name that matches no case or several, or no GPU."""

import argparse
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", help="a YAML suite")
    parser.add_argument("case", help="the name of one of its cases (or a glob matching one)")
    parser.add_argument("--times", type=int, default=4, help="launches (default 4)")
    parser.add_argument("--impl", default="cuda", help="the implementation launched, as `kdtree bench --impl` "
                        "names it (default: cuda, our kernel; e.g. flashmla, sglang_triton)")
    parser.add_argument("--kernel", help="launch this kernel of ours forced by name instead (as `kdtree bench "
                        "--kernel` takes it)")
    parser.add_argument("--define", metavar="KERNEL:KNOB=V[,KNOB=V]", help="launch this build of one of our "
                        "kernels instead (as `kdtree bench --define` takes it)")
    args = parser.parse_args()

    import torch

    from kdtr.errors import KdtreeError, UsageError
    from kdtr.impl.backends import upload
    from kdtr.impl.builds import kernel_builds
    from kdtr.impl.builtin import cuda_build
    from kdtr.impl.resolve import resolve
    from suite_case import one_case

    try:
        builds = kernel_builds([args.kernel] if args.kernel else [], [args.define] if args.define else [])
        if len(builds) > 1:
            raise UsageError("--kernel and --define: one build at a time")
        label = builds[0].label if builds else args.impl
        impl = cuda_build(label, builds[0].name, builds[0].defines) if builds else resolve(args.impl)
    except KdtreeError as err:
        print(f"launch-case: {err}", file=sys.stderr)
        return 2
    case, op, gen = one_case("launch-case", args.suite, args.case)
    with torch.no_grad():
        call = impl.prepare(op, case.variant, upload(gen.inputs, "cuda"), gen.params)
        for _ in range(args.times):
            call()
        torch.cuda.synchronize()
    if label != "cuda":
        print("ran", case.name, label)
        return 0
    kernel = op.kernel_choice(case.variant, gen.inputs, gen.params)
    print("ran", case.name, kernel, op.launch_grid(case.variant, gen.inputs, gen.params, kernel))
    return 0


if __name__ == "__main__":
    sys.exit(main())
