"""kdtr/runtime/device.py on the CPU: what it hands the driver (its launches are tested on the GPU by
tests/kernels/test_cuda_kernels.py)."""
from __future__ import annotations

import pytest

from kdtr.runtime import device


def test_a_dependent_launch_allows_programmatic_stream_serialization():
    """Kernel.launch(dependent=True) goes through cuLaunchKernelEx with this config: the grid, block,
    shared memory and stream as given, and the one attribute that lets the grid start while the one
    before it finishes (fp32_bf16x3's pieces, main and merge kernels wait for it in the kernel)."""
    driver = device._driver()
    stream = driver.CUstream(0)
    config = device._dependent_config((17, 1, 7), (512, 1, 1), 229576, stream)
    assert (config.gridDimX, config.gridDimY, config.gridDimZ) == (17, 1, 7)
    assert (config.blockDimX, config.blockDimY, config.blockDimZ) == (512, 1, 1)
    assert config.sharedMemBytes == 229576
    assert config.numAttrs == 1 and len(config.attrs) == 1
    attr = config.attrs[0]
    assert attr.id == driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert attr.value.programmaticStreamSerializationAllowed == 1


def test_a_stand_in_answers_for_the_device_and_leaves_it_as_it_was():
    """device.stand_in: the one hook the CPU emulator uses; nothing of it stays after the block,
    and a second stand-in inside the first is refused."""
    from types import SimpleNamespace

    built = []
    gpu = SimpleNamespace(arch=80, sms=108, smem_optin=166912,
                          get_kernel=lambda source, name, defines, arch: built.append((source, name, defines, arch)))
    before = device.gpu_available()
    with device.stand_in(gpu):
        assert device.gpu_available() and device.device_arch() == "sm_80"
        assert (device.multiprocessor_count(), device.max_shared_optin()) == (108, 166912)
        device.get_kernel("x.cu", "entry", defines={"N": 1}, arch="sm_80")
        with pytest.raises(RuntimeError, match="already in place"), device.stand_in(gpu):
            pass
    assert built == [("x.cu", "entry", {"N": 1}, "sm_80")]
    assert device.gpu_available() == before and device._stand_in is None
