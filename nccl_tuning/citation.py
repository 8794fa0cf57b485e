"""A citation: one line of NCCL's code, the text it holds and its line number at each source tag
read.

The tables of citations (cites_tuning, cites_params, cites_iflist) are built with Cite.at;
ncclsrc.cite turns a key into `nccl-<tag>/<path>:<line>`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cite:
    file: str  # path inside nccl-<tag>/
    quote: str  # text the cited line contains
    lines: dict  # tag -> line number

    @classmethod
    def at(cls, file: str, quote: str, **lines) -> Cite:
        """Cite.at(path, text, v2_24_3=99, ...): the keywords name the tags (v2_24_3 = (2, 24,
        3))."""
        return cls(
            file, quote, {tuple(int(x) for x in k[1:].split("_")): v for k, v in lines.items()}
        )
