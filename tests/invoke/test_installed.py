"""`handlers/` ships in the `fusee` distribution: once the package is installed,
`uvicorn handlers.asgi:app` works from any directory, not only from the checkout's root.

Every process here runs in a directory outside the checkout with PYTHONPATH unset, so only
what the installation puts on the path can be found (the checkout's root would otherwise
be on it, as the current directory or through PYTHONPATH, and hide a missing package)."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.support.handlers import SECRET, Uvicorn
from tests.support.procs import ROOT

APP = """import fusee


@fusee.workflow("outside")
async def outside(ctx: fusee.Ctx) -> str:
    return "here"
"""


def outside(tmp_path: Path) -> dict[str, str]:
    """An app's directory away from the checkout, and the handler's settings naming it."""
    (tmp_path / "outside_app.py").write_text(APP)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSEE_") and k != "PYTHONPATH"}
    env.update(FUSEE_URL="127.0.0.1:7600", FUSEE_INVOKE_SECRET=SECRET, FUSEE_WORKFLOWS="outside_app")
    return env


def test_the_handlers_import_from_outside_the_checkout(tmp_path: Path) -> None:
    code = (
        "import sys, handlers, handlers.asgi;"
        "print(handlers.__file__);"
        "print([w.name for w in handlers.asgi.app.workflows]);"
        f"print({str(ROOT)!r} in sys.path)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=outside(tmp_path), capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    where, names, root_on_path = done.stdout.splitlines()
    # The installed package (an editable install maps it to the checkout's folder).
    assert Path(where).resolve().parent.name == "handlers"
    assert names == "['outside']"
    assert root_on_path == "False"


def test_uvicorn_serves_the_handlers_from_outside_the_checkout(tmp_path: Path) -> None:
    app = Uvicorn(outside(tmp_path), cwd=tmp_path)
    try:
        status, _, body = app.request("POST", {}, b"{}")
    finally:
        app.stop()
    assert (status, body) == (401, b'{"error":"unauthorized"}')


def test_the_wheel_holds_the_handlers(tmp_path: Path) -> None:
    """Built from a copy of what the distribution is made of, so the build leaves nothing
    in the checkout (build/, *.egg-info)."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        (source / name).write_bytes((ROOT / name).read_bytes())
    for package in ("fusee", "handlers"):
        for path in (ROOT / package).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                target = source / path.relative_to(ROOT)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(path.read_bytes())
    out = tmp_path / "wheel"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    [wheel] = out.glob("fusee-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"handlers/__init__.py", "handlers/asgi.py", "handlers/aws_lambda.py"} <= names
    assert "fusee/__init__.py" in names
    assert not [n for n in names if n.startswith(("tests/", "examples/", "server/", "bench/"))]
