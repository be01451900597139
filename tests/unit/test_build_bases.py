"""The images a Dockerfile builds on, read before a build so that no build ever pulls."""

from __future__ import annotations

import pytest

from runyard.builds.bases import BaseProblem, base_images, instructions, missing_base_message


@pytest.mark.parametrize(
    ("dockerfile", "args", "expected"),
    [
        ("FROM runyard/base:latest\nCOPY a /a\n", {}, ["runyard/base:latest"]),
        ("from python:3.12-slim\n", {}, ["python:3.12-slim"]),
        ("FROM scratch\nCOPY rootfs/ /\n", {}, []),
        ("FROM --platform=linux/amd64 runyard/base AS one\n", {}, ["runyard/base"]),
        (
            "FROM runyard/base AS build\nRUN true\nFROM build\nFROM runyard/toolbox:latest\n"
            "COPY --from=build /x /x\nCOPY --from=0 /y /y\nCOPY --from=acme/tools:1 /z /z\n",
            {},
            ["runyard/base", "runyard/toolbox:latest", "acme/tools:1"],
        ),
        ("ARG BASE=runyard/base:latest\nFROM ${BASE}\n", {}, ["runyard/base:latest"]),
        ("ARG BASE=runyard/base:latest\nFROM $BASE\n", {"BASE": "mine:2"}, ["mine:2"]),
        ("ARG TAG\nFROM runyard/base:${TAG:-latest}\n", {}, ["runyard/base:latest"]),
        ("ARG V=1\nFROM a\nARG V=2\nFROM b:${V}\n", {}, ["a", "b:1"]),
        ("# a comment\nFROM \\\n  runyard/base \\\n  AS built\n", {}, ["runyard/base"]),
        ("# escape=`\nFROM `\n  runyard/base\n", {}, ["runyard/base"]),
        ("FROM a\nFROM a\n", {}, ["a"]),
    ],
)
def test_base_images__every_image_the_build_would_need(
    dockerfile: str, args: dict[str, str], expected: list[str]
):
    assert base_images(dockerfile, args) == expected


@pytest.mark.parametrize(
    ("dockerfile", "problem"),
    [
        ("ARG BASE\nFROM ${BASE}\n", "FROM ${BASE}: the build arg BASE has no value"),
        ("FROM $NOWHERE:1\n", "FROM $NOWHERE:1: the build arg NOWHERE has no value"),
        ("FROM --platform=linux/amd64\n", "a FROM names no image"),
    ],
)
def test_base_images__a_base_that_cannot_be_named_is_a_problem(dockerfile: str, problem: str):
    with pytest.raises(BaseProblem, match="^" + problem.replace("$", r"\$") + "$"):
        base_images(dockerfile, {})


def test_instructions__joined_and_without_comments():
    assert instructions("# c\nRUN a \\\n  b\n\nCOPY x y\n") == [("RUN", "a b"), ("COPY", "x y")]


def test_missing_base_message__names_the_image_and_how_to_get_it():
    message = missing_base_message(["python:3.12-slim"])
    assert message.startswith("the base image python:3.12-slim is not on this engine")
    assert "builds never pull" in message and "scripts/build-images" in message
    assert "docker save IMAGE | docker load" in message
    assert missing_base_message(["a", "b"]).startswith("the base images a, b are not")
