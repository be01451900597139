"""The images a Dockerfile builds on, read before the build: the engine's builder pulls a
missing base image even when asked not to pull, so a build checks them first."""

from __future__ import annotations

import io
import re
import tarfile
from collections.abc import Mapping

# ${NAME}, ${NAME:-word}, ${NAME:+word} and $NAME, as the Dockerfile's variables go.
_VARIABLE = re.compile(
    r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?::(?P<op>[-+])(?P<word>[^}]*))?\}"
    r"|(?P<bare>[A-Za-z_][A-Za-z0-9_]*))"
)
_DIRECTIVE = re.compile(r"#\s*escape\s*=\s*(?P<char>\S)\s*$", re.IGNORECASE)

HOW_TO_GET_A_BASE = (
    "builds never pull: build or load the image on this engine first"
    " (scripts/build-images makes runyard/base:latest and runyard/toolbox:latest;"
    " an image from another machine: docker save IMAGE | docker load here), or start FROM"
    " one of those"
)


class BaseProblem(Exception):
    """A base image cannot be named before the build (a FROM whose variable has no value)."""


def instructions(dockerfile: str) -> list[tuple[str, str]]:
    """``(keyword in upper case, rest)`` of every instruction: comments dropped, continued
    lines joined (with the escape character a parser directive may choose)."""
    lines = dockerfile.splitlines()
    escape = "\\"
    for line in lines:
        if not line.startswith("#"):
            break
        directive = _DIRECTIVE.match(line)
        if directive is not None:
            escape = directive.group("char")
    found: list[tuple[str, str]] = []
    pending = ""
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if stripped.endswith(escape):
            pending += stripped[: -len(escape)].rstrip() + " "
            continue
        whole = (pending + stripped).strip()
        pending = ""
        if whole:
            keyword, _, rest = whole.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    if pending.strip():
        keyword, _, rest = pending.strip().partition(" ")
        found.append((keyword.upper(), rest.strip()))
    return found


def _substitute(text: str, values: Mapping[str, str], where: str) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("bare")
        value = values.get(name, "")
        if match.group("op") == "-":
            return value or match.group("word")
        if match.group("op") == "+":
            return match.group("word") if value else ""
        if name not in values:
            raise BaseProblem(f"{where}: the build arg {name} has no value")
        return value

    return _VARIABLE.sub(one, text)


def _global_arg(rest: str, args: Mapping[str, str], values: dict[str, str]) -> None:
    for item in rest.split():
        name, has_default, default = item.partition("=")
        if name in args:
            values[name] = args[name]
        elif has_default:
            values[name] = default.strip("\"'")


def base_images(dockerfile: str, args: Mapping[str, str]) -> list[str]:
    """The images the Dockerfile starts FROM or copies ``--from``, in order, without
    ``scratch``, its own stages and repeats. Raises ``BaseProblem`` for a FROM that names a
    build arg without a value."""
    values: dict[str, str] = {}
    stages: set[str] = set()
    images: list[str] = []
    seen_from = False

    def add(image: str) -> None:
        if image.lower() != "scratch" and image.lower() not in stages and image not in images:
            images.append(image)

    for keyword, rest in instructions(dockerfile):
        if keyword == "ARG" and not seen_from:
            _global_arg(rest, args, values)
        elif keyword == "FROM":
            seen_from = True
            words = [w for w in rest.split() if not w.startswith("--")]
            if not words:
                raise BaseProblem("a FROM names no image")
            image = _substitute(words[0], values, f"FROM {words[0]}")
            if not image:
                raise BaseProblem(f"FROM {words[0]} names no image")
            add(image)
            if len(words) >= 3 and words[1].lower() == "as":
                stages.add(words[2].lower())
        elif keyword == "COPY":
            for word in rest.split():
                if word.lower().startswith("--from="):
                    source = word.split("=", 1)[1]
                    if not source.isdigit():
                        add(source)
    return images


def dockerfile_of(context: bytes, path: str) -> str:
    """The Dockerfile's text from the context's tar."""
    with tarfile.open(fileobj=io.BytesIO(context)) as tar:
        member = tar.extractfile(path)
        if member is None:
            raise BaseProblem(f"the context has no {path}")
        return member.read().decode("utf-8", errors="replace")


def missing_base_message(images: list[str]) -> str:
    """What a build whose base images are not on the engine says."""
    named = ", ".join(images)
    noun = "base image" if len(images) == 1 else "base images"
    verb = "is" if len(images) == 1 else "are"
    return f"the {noun} {named} {verb} not on this engine, and {HOW_TO_GET_A_BASE}"
