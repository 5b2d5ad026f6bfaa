"""Does this node's NVIDIA driver run the CUDA version torch was built with?

A driver older than the CUDA runtime of the image's torch shows up late and obscurely (torch
sees no GPU, or a kernel fails to load mid-build). The replica checks it first
(`VllmEngine.start` on CUDA) and names the driver to install.
"""

from __future__ import annotations

# CUDA toolkit version -> the Linux driver released with it (NVIDIA's CUDA release notes,
# "CUDA Toolkit and Corresponding Driver Versions"). Drivers of the same major CUDA version
# but older than this run many programs ("minor version compatibility"), not all of them
# (PTX built by a newer toolkit, some libraries), so the requirement is this driver.
MIN_DRIVER: dict[tuple[int, int], tuple[int, ...]] = {
    (11, 8): (520, 61, 5),
    (12, 0): (525, 60, 13),
    (12, 1): (530, 30, 2),
    (12, 2): (535, 54, 3),
    (12, 3): (545, 23, 6),
    (12, 4): (550, 54, 14),
    (12, 5): (555, 42, 2),
    (12, 6): (560, 28, 3),
    (12, 8): (570, 26),
    (12, 9): (575, 51, 3),
    (13, 0): (580, 65, 6),
    (13, 1): (590, 44, 1),
}


class DriverTooOld(RuntimeError):
    pass


def _parse(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.strip().split("."))


def minimum_driver(cuda_version: str) -> tuple[int, ...]:
    """The oldest Linux driver for torch built with CUDA `cuda_version` ('12.8', '13.0').
    A version newer than the table asks for the newest known driver, which is a lower bound."""
    major, minor = _parse(cuda_version)[:2]
    known = sorted(v for v in MIN_DRIVER if v <= (major, minor))
    if not known:
        raise ValueError(f"CUDA {cuda_version} is older than any version ooo-spec knows")
    return MIN_DRIVER[known[-1]]


def driver_problem(cuda_version: str, driver_version: str) -> str | None:
    """None when driver `driver_version` ('570.133.20') runs CUDA `cuda_version`, else why not."""
    needed = minimum_driver(cuda_version)
    if _parse(driver_version) >= needed:
        return None
    wanted = ".".join(str(part) for part in needed)
    return (
        f"the NVIDIA driver {driver_version} on this node is too old for this image: its torch "
        f"is built with CUDA {cuda_version}, which needs driver {wanted} or newer. Upgrade the "
        "node's driver (or its GPU node image), or build the image with a torch for an older CUDA."
    )


def check_driver() -> None:
    """Raise `DriverTooOld` on a CUDA node whose driver cannot run this torch."""
    import torch

    cuda_version = torch.version.cuda
    if not cuda_version:
        return
    driver = installed_driver()
    if driver is None:
        return  # no NVML to ask: torch and vLLM will say what is wrong themselves
    problem = driver_problem(cuda_version, driver)
    if problem is not None:
        raise DriverTooOld(problem)


def installed_driver() -> str | None:
    """The node's driver version through NVML (the library nvidia-smi uses)."""
    try:
        # vLLM ships its own copy of NVIDIA's NVML bindings (nvidia-ml-py).
        import vllm.third_party.pynvml as pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        return None
    return version.decode() if isinstance(version, bytes) else str(version)
