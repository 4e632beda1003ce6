"""A Dockerfile read as Docker reads it, for the instructions examples/cloudrun uses, and
its image laid out in a directory, so that a test runs the image's command as the
container would, with no Docker daemon.

What is reproduced:
- `COPY` and `WORKDIR` as Docker applies them, the build context filtered by the
  Dockerfile's ignore file, into a directory that stands for the image's `/`;
- `RUN pip install ...`: a virtualenv stands for the image's Python and gets what pip
  would install there: a local project's packages from the copied source (as its
  pyproject's `packages.find` selects them), every requirement and dependency of theirs
  linked from this test run's environment (the same distributions, versions checked
  against the specifiers), and the console scripts;
- `ENV` and `CMD`: the CMD runs as Docker runs it (shell form through `/bin/sh -c`), in
  the WORKDIR, with the image's environment and nothing else: no PYTHONPATH, nothing
  of this repository but what the COPY lines put in the image;
- `RUN rm -rf PATH...`, under the image's root.

Not reproduced: the base image's system (this machine's Python stands in for `FROM`'s),
`useradd` and `USER` (the command runs as whoever runs the tests). Any other
instruction, RUN command or option fails the parse, so that a change to the Dockerfile
cannot pass the tests unseen.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import shutil
import subprocess
import sys
import threading
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import IO

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

INSTRUCTIONS = ("FROM", "COPY", "RUN", "WORKDIR", "USER", "ENV", "CMD")
RUN_COMMANDS = ("pip", "rm", "useradd")  # pip and rm are reproduced; useradd is the system's


@dataclass
class Copy:
    sources: list[str]  # relative to the build context
    dest: str  # absolute in the image
    into_dir: bool  # dest is a directory the sources go into (Docker's rule, see `parse`)


@dataclass
class Dockerfile:
    base: str = ""
    workdir: str = "/"
    env: dict[str, str] = field(default_factory=dict)
    steps: list[Copy | list[list[str]]] = field(default_factory=list)  # a COPY, or a RUN's commands
    user: str | None = None
    cmd: list[str] = field(default_factory=list)  # as Docker executes it


def logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, instruction) with continuation lines joined: a backslash at
    the end of a line continues it. Comment lines are dropped, inside an instruction too,
    as Docker drops them."""
    found: list[tuple[int, str]] = []
    current: str | None = None
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if current is None:
            current, start = "", number
        if stripped.endswith("\\"):
            current += raw.rstrip()[:-1]
            continue
        found.append((start, (current + raw).strip()))
        current = None
    if current is not None:
        raise ValueError(f"line {start}: the Dockerfile ends inside a continued instruction")
    return found


def parse(text: str) -> Dockerfile:
    image = Dockerfile()
    for number, line in logical_lines(text):
        keyword, _, rest = line.partition(" ")
        keyword, rest, where = keyword.upper(), rest.strip(), f"Dockerfile line {number}"
        if keyword not in INSTRUCTIONS:
            raise ValueError(f"{where}: {keyword} is not an instruction this reader reproduces")
        if keyword == "FROM":
            if image.base:
                raise ValueError(f"{where}: a second FROM (multi-stage builds are not reproduced)")
            image.base = rest
        elif keyword == "WORKDIR":
            image.workdir = str(PurePosixPath(image.workdir) / rest)
        elif keyword == "ENV":
            image.env.update(_env(rest, where))
        elif keyword == "COPY":
            words = json.loads(rest) if rest.startswith("[") else shlex.split(rest)
            if len(words) < 2 or any(word.startswith("--") for word in words):
                raise ValueError(f"{where}: COPY SRC... DEST, without options, is what is reproduced")
            *sources, dest = words
            # Docker: a destination ending in "/" is a directory, and so is one that several
            # sources go to; otherwise a single file source is copied *to* it.
            into_dir = dest.endswith("/") or dest in (".", "./") or len(sources) > 1
            image.steps.append(Copy(sources, str(PurePosixPath(image.workdir) / dest), into_dir))
        elif keyword == "RUN":
            commands = [shlex.split(part) for part in rest.split("&&")]
            for argv in commands:
                if not argv or argv[0] not in RUN_COMMANDS:
                    raise ValueError(f"{where}: RUN {' '.join(argv)!r} is not reproduced")
            image.steps.append(commands)
        elif keyword == "USER":
            image.user = rest
        else:  # CMD: the exec form as written, the shell form through the image's shell
            image.cmd = json.loads(rest) if rest.startswith("[") else ["/bin/sh", "-c", rest]
    if not image.base or not image.cmd:
        raise ValueError("the Dockerfile has no FROM or no CMD")
    return image


def _env(rest: str, where: str) -> dict[str, str]:
    words = shlex.split(rest)
    if words and "=" not in words[0]:  # the old form: ENV KEY the rest of the line
        return {words[0]: rest[len(words[0]) :].strip()}
    pairs = dict(word.split("=", 1) for word in words if "=" in word)
    if len(pairs) != len(words) or any("$" in value for value in pairs.values()):
        raise ValueError(f"{where}: ENV KEY=VALUE pairs without substitution are what is reproduced")
    return pairs


# -- the build context ------------------------------------------------------------------


def ignore_rules(path: Path) -> list[tuple[bool, re.Pattern[str]]]:
    """A .dockerignore's rules in order: (an exception `!`, the pattern)."""
    rules = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        rules.append((exception, _pattern(line.lstrip("!").strip().strip("/"))))
    return rules


def _pattern(glob: str) -> re.Pattern[str]:
    """Go's filepath.Match with Docker's `**` (any number of directories)."""
    if "[" in glob or "\\" in glob:
        raise ValueError(f"ignore pattern {glob!r}: character classes and escapes are not reproduced")
    out, i = "", 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif glob.startswith("**", i):
            out, i = out + ".*", i + 2
        else:
            out += {"*": "[^/]*", "?": "[^/]"}.get(glob[i], re.escape(glob[i]))
            i += 1
    return re.compile(out)


def included(relative: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether the context keeps `relative`: the last rule that matches it or one of its
    parent directories decides (Docker's matcher), no rule keeps it."""
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    keep = True
    for exception, pattern in rules:
        if any(pattern.fullmatch(prefix) for prefix in prefixes):
            keep = exception
    return keep


# -- the image --------------------------------------------------------------------------


@dataclass
class Image:
    spec: Dockerfile
    root: Path  # stands for the image's "/"
    python: Path  # the virtualenv that stands for the image's Python
    installed: set[str] = field(default_factory=set)  # canonical distribution names

    def path(self, image_path: str) -> Path:
        return self.root / image_path.lstrip("/")

    @property
    def bin(self) -> Path:
        return self.python / "bin"

    @property
    def site(self) -> Path:
        return self.python / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"

    def environment(self, **settings: str) -> dict[str, str]:
        """The container's environment: the base image's PATH and LANG (its Python is
        the virtualenv), the Dockerfile's ENV, then `settings` (the platform's)."""
        env = {"PATH": f"{self.bin}:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
        env["HOME"] = str(self.root)
        return {**env, **self.spec.env, **settings}


def build(dockerfile: Path, context: Path, root: Path) -> Image:
    """The image `dockerfile` describes, from `context`, laid out under `root`."""
    spec = parse(dockerfile.read_text())
    own = dockerfile.with_name(dockerfile.name + ".dockerignore")  # BuildKit's, before the root's
    ignore = own if own.exists() else context / ".dockerignore"
    rules = ignore_rules(ignore) if ignore.exists() else []
    python = root / "usr" / "local"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(python)], check=True)
    image = Image(spec, root, python)
    for step in spec.steps:
        if isinstance(step, Copy):
            _copy(step, context, rules, image)
        else:
            for argv in step:
                if argv[0] == "pip":
                    _pip_install(argv, image)
                elif argv[0] == "rm":
                    _remove(argv, image)
    return image


def _copy(step: Copy, context: Path, rules: list[tuple[bool, re.Pattern[str]]], image: Image) -> None:
    dest = image.path(step.dest)
    for source in step.sources:
        found = context / source
        relative = found.relative_to(context).as_posix()
        if not found.exists() or (found.is_file() and not included(relative, rules)):
            raise FileNotFoundError(f"COPY {source}: not in the build context (missing or ignored)")
        if found.is_dir():  # its contents, not the directory itself
            for file in sorted(found.rglob("*")):
                if file.is_file() and included(file.relative_to(context).as_posix(), rules):
                    target = dest / file.relative_to(found)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(file, target)
        else:
            target = dest / found.name if step.into_dir else dest
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(found, target)


def _pip_install(argv: list[str], image: Image) -> None:
    if argv[1:2] != ["install"] or any(a.startswith("-") and a != "--no-cache-dir" for a in argv[2:]):
        raise ValueError(f"RUN {' '.join(argv)}: `pip install [--no-cache-dir] TARGET...` is reproduced")
    for target in (a for a in argv[2:] if not a.startswith("-")):
        if target.startswith(("/", ".")):
            _install_project(image.path(target), image)
        else:
            _install_requirement(Requirement(target), image)


def _remove(argv: list[str], image: Image) -> None:
    if argv[1:2] != ["-rf"] or not all(path.startswith("/") for path in argv[2:]):
        raise ValueError(f"RUN {' '.join(argv)}: `rm -rf /ABSOLUTE...` is reproduced")
    for path in argv[2:]:
        shutil.rmtree(image.path(path), ignore_errors=True)


def _install_project(source: Path, image: Image) -> None:
    """A local project as pip installs it: its packages (as `packages.find` selects them)
    copied from the source the image holds, a dist-info, its scripts, its dependencies."""
    project = tomllib.loads((source / "pyproject.toml").read_text())
    meta = project["project"]
    if not (source / meta.get("readme", "pyproject.toml")).exists():
        raise FileNotFoundError(f"{source}: the readme {meta['readme']} the project names is not there")
    patterns = project["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = [p for p in sorted(source.iterdir()) if (p / "__init__.py").exists()]
    chosen = [p for p in packages if any(fnmatch.fnmatch(p.name, pattern) for pattern in patterns)]
    if not chosen:
        raise FileNotFoundError(f"{source}: no package matches {patterns}")
    for package in chosen:
        shutil.copytree(package, image.site / package.name, ignore=shutil.ignore_patterns("__pycache__"))
    info = image.site / f"{meta['name']}-{meta['version']}.dist-info"
    info.mkdir()
    lines = ["Metadata-Version: 2.1", f"Name: {meta['name']}", f"Version: {meta['version']}"]
    info.joinpath("METADATA").write_text(
        "\n".join(lines + [f"Requires-Dist: {d}" for d in meta["dependencies"]])
    )
    image.installed.add(canonicalize_name(meta["name"]))
    for name, value in meta.get("scripts", {}).items():
        _script(image, name, value)
    for dependency in meta["dependencies"]:
        _install_requirement(Requirement(dependency), image)


def _install_requirement(
    requirement: Requirement, image: Image, extras: frozenset[str] = frozenset()
) -> None:
    if requirement.marker is not None and not any(
        requirement.marker.evaluate({"extra": extra}) for extra in {"", *extras}
    ):
        return
    name = canonicalize_name(requirement.name)
    if name in image.installed:
        return
    try:
        dist = metadata.distribution(requirement.name)
    except metadata.PackageNotFoundError:
        raise LookupError(f"{requirement}: not installed here, so the image cannot be stood in for") from None
    if not requirement.specifier.contains(dist.version, prereleases=True):
        raise LookupError(f"{requirement}: this environment has {dist.version}")
    image.installed.add(name)
    # A one-module distribution (jsonpatch.py) lists its bytecode under the shared __pycache__.
    tops = {file.parts[0] for file in dist.files or [] if file.parts[0] not in ("..", "__pycache__")}
    for top in sorted(tops):
        (image.site / top).symlink_to(Path(str(dist.locate_file(top))))
    for entry in dist.entry_points:
        if entry.group == "console_scripts":
            _script(image, entry.name, entry.value)
    for dependency in dist.requires or []:
        _install_requirement(Requirement(dependency), image, frozenset(requirement.extras))


def _script(image: Image, name: str, value: str) -> None:
    """A console script as pip writes it: the image's Python, the entry point called."""
    module, _, attribute = value.partition(":")
    script = image.bin / name
    script.write_text(
        f"#!{image.bin / 'python'}\nimport sys\nimport {module}\nsys.exit({module}.{attribute}())\n"
    )
    script.chmod(0o755)


class Container:
    """The image's CMD, running: its output collected line by line."""

    def __init__(self, image: Image, env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.popen = subprocess.Popen(
            image.spec.cmd,
            cwd=image.path(image.spec.workdir),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.popen.stdout is not None
        self.drain = threading.Thread(target=self._drain, args=(self.popen.stdout,), daemon=True)
        self.drain.start()

    def _drain(self, stream: IO[str]) -> None:
        for line in stream:
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def wait_for(self, pattern: str, timeout: float = 20.0) -> re.Match[str]:
        compiled = re.compile(pattern)
        with self.changed:
            ended = self.changed.wait_for(
                lambda: any(compiled.search(line) for line in self.lines) or not self.drain.is_alive(),
                timeout,
            )
            for line in self.lines:
                if found := compiled.search(line):
                    return found
        why = "exited" if ended else "timed out"
        raise AssertionError(f"container {why} with no line matching {pattern!r}:\n" + self.output())

    def output(self) -> str:
        return "\n".join(self.lines[-60:])

    def stop(self) -> int:
        """SIGTERM, as Cloud Run stops an instance; the exit status."""
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(10)
        self.drain.join(5)
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        return self.popen.returncode
