"""The packaging: requirements-dev.lock agrees with what the two pyproject.toml files ask
for (scripts/setup installs from the lock alone, so a dependency added without
re-running scripts/lock would go missing or arrive unpinned), and fusee-server pins the
fusee it speaks the wire with."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
OURS = {"fusee", "fusee-server"}


def _toml(path: str) -> dict[str, Any]:
    loaded: dict[str, Any] = tomllib.loads((ROOT / path).read_text())
    return loaded


def _pins() -> dict[str, Version]:
    """The lock's `name==version` lines (a line may carry an environment marker)."""
    pins: dict[str, Version] = {}
    for line in (ROOT / "requirements-dev.lock").read_text().splitlines():
        found = re.match(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^ ;\\]+)", line)
        if found:
            name = canonicalize_name(found[1])
            assert name not in pins or pins[name] != Version(found[2]), f"{name} pinned twice"
            pins.setdefault(name, Version(found[2]))
    return pins


def _direct() -> list[Requirement]:
    """What the lock must cover: fusee's dependencies and extras (`lambda`, `otel`), the `dev` group,
    and fusee-server's dependencies and extras; the two packages themselves come from the
    checkout."""
    fusee, server = _toml("pyproject.toml"), _toml("server/pyproject.toml")
    texts = [
        *fusee["project"]["dependencies"],
        *(text for extra in fusee["project"]["optional-dependencies"].values() for text in extra),
        *fusee["dependency-groups"]["dev"],
        *server["project"]["dependencies"],
        *(text for extra in server["project"]["optional-dependencies"].values() for text in extra),
    ]
    return [req for req in map(Requirement, texts) if canonicalize_name(req.name) not in OURS]


def test_every_direct_dependency_is_pinned_in_the_lock_at_a_version_it_accepts() -> None:
    pins = _pins()
    assert len(pins) > 50  # the whole tree, not only the direct dependencies
    for req in _direct():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req} is not in requirements-dev.lock: run scripts/lock"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"requirements-dev.lock pins {name}=={pins[name]}, outside {req}: run scripts/lock"
        )


def test_the_lock_pins_every_package_with_hashes_and_leaves_ours_out() -> None:
    text = (ROOT / "requirements-dev.lock").read_text()
    blocks = re.split(r"\n(?=[a-z0-9])", text)
    pinned = [block for block in blocks if re.match(r"[a-z0-9][a-z0-9._-]*==", block)]
    assert pinned and all("--hash=sha256:" in block for block in pinned)
    assert not OURS & set(_pins())


def test_the_development_tools_are_a_dependency_group_not_an_extra() -> None:
    project = _toml("pyproject.toml")["project"]
    assert "dev" not in project.get("optional-dependencies", {})
    names = {
        canonicalize_name(Requirement(text).name)
        for text in _toml("pyproject.toml")["dependency-groups"]["dev"]
    }
    assert {"pytest", "mypy", "ruff"} <= names


def test_fusee_server_pins_the_fusee_it_speaks_the_wire_with() -> None:
    fusee_version = Version(_toml("pyproject.toml")["project"]["version"])
    assert fusee_version.release[:2] == (0, 1)
    wanted = [
        Requirement(text)
        for text in _toml("server/pyproject.toml")["project"]["dependencies"]
        if canonicalize_name(Requirement(text).name) == "fusee"
    ]
    assert [str(req.specifier) for req in wanted] == ["==0.1.*"]
    assert wanted[0].specifier.contains(fusee_version)
    assert _toml("server/pyproject.toml")["project"]["version"] == str(fusee_version)
