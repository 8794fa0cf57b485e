"""The image references each container runtime reads as an image (IMAGE_FORMS, image_ok): podman's
docker/OCI references and transports, pyxis's enroot URIs and squashfs paths, apptainer's SIF paths
and URIs -- never an option. Pure grammar, stdlib only;
launchers.containers.containeropts.check_image refuses what it does not accept.
"""

from __future__ import annotations

import re

# image references as each runtime reads them (never an option: a leading '-' matches none of
# these): docker/OCI (distribution/reference grammar): [DOMAIN[:PORT]/]PATH[:TAG][@DIGEST], PATH's
# components lowercase; the first component is a domain only when it has a '.' or ':' or is
# localhost (else it is part of the path)
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*|\[[0-9A-Fa-f:]+\])(?::[0-9]+)?"  # noqa: E501
_TAG_DIGEST = r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9A-Fa-f]{32,})?"  # noqa: E501
_PATH = rf"{_COMPONENT}(?:/{_COMPONENT})*"
_DOCKER_REF = re.compile(rf"^(?:(?:{_DOMAIN})/)?{_PATH}{_TAG_DIGEST}$")
# enroot (pyxis): [USER@][REGISTRY#]IMAGE[:TAG] (enroot-import(1)), a scheme in front or not
_ENROOT_REF = re.compile(
    rf"^(?:docker://|dockerd://|podman://)?(?:[A-Za-z0-9._-]+@)?(?:{_DOMAIN}#)?{_PATH}{_TAG_DIGEST}$"
)
_PATH_WORD = re.compile(r"^[^-:\s\x00][^:\s\x00]*$")  # a file path: no leading '-', no ':'
PODMAN_PATH_TRANSPORTS = ("docker-archive:", "oci-archive:", "oci:", "dir:")
APPTAINER_URIS = (
    "docker://",
    "oras://",
    "library://",
    "shub://",
    "docker-daemon:",
    "http://",
    "https://",
)
IMAGE_FORMS = {
    "podman": (
        "[REGISTRY[:PORT]/]NAME[:TAG][@DIGEST] with a lowercase NAME (e.g. "
        "docker.io/library/python:3.11, localhost/train:1), docker://REF, "
        "containers-storage:REF, or docker-archive:/oci-archive:/oci:/dir: and a path"
    ),
    "pyxis": (
        "[USER@][REGISTRY#]IMAGE[:TAG] (e.g. nvcr.io#nvidia/pytorch:24.05-py3), docker://, "
        "dockerd:// or podman:// in front, or a squashfs file path starting with / or ./"
    ),
    "apptainer": (
        "a SIF file or sandbox path (e.g. ./train.sif, /images/train.sif) or a URI: "
        "docker://REF, oras://REF, library://REF, shub://REF, docker-daemon:REF, "
        "docker-archive:/oci-archive:/oci: and a path"
    ),
}


def _docker_ref(ref: str) -> bool:
    first, _, rest = ref.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return len(ref) <= 255 and bool(_DOCKER_REF.match(ref))  # a domain, then the path
    # no domain: all path
    return len(ref) <= 255 and bool(re.match(rf"^{_PATH}{_TAG_DIGEST}$", ref))


def image_ok(value: str, runtime: str) -> bool:
    """Whether `value` is an image reference `runtime` reads as an image (IMAGE_FORMS): never an
    option."""
    if value.startswith("-"):
        return False
    if runtime == "podman":
        for transport in PODMAN_PATH_TRANSPORTS:
            if value.startswith(transport):
                return bool(_PATH_WORD.match(value[len(transport) :].split(":", 1)[0]))
        for transport in ("docker://", "containers-storage:"):
            value = value[len(transport) :] if value.startswith(transport) else value
        return _docker_ref(value)
    if runtime == "pyxis":
        return (
            value.startswith(("/", "./", "../"))
            and bool(_PATH_WORD.match(value))
            or bool(_ENROOT_REF.match(value))
            and len(value) <= 512
        )
    for uri in APPTAINER_URIS:  # apptainer
        if value.startswith(uri):
            rest = value[len(uri) :]
            return (
                _docker_ref(rest)
                if uri in ("docker://", "docker-daemon:")
                else bool(rest)
                and not rest.startswith("-")
                and bool(re.match(r"^[\w.:/@#+-]+$", rest))
            )
    for transport in ("docker-archive:", "oci-archive:", "oci:"):
        if value.startswith(transport):
            return bool(_PATH_WORD.match(value[len(transport) :].split(":", 1)[0]))
    return bool(_PATH_WORD.match(value))
