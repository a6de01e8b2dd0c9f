"""kdtr/runtime/device.py on the CPU: what it hands the driver (its launches are tested on the GPU by
tests/kernels/test_cuda_kernels.py)."""
from __future__ import annotations

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
