"""Each provider's own bounds on one native batch job, in one table: requests per job, and bytes of its input
(as the provider's line form writes it).

The runner (`providers.native.runner`) splits each shard's lines into jobs within its provider's row: a file
of any size is run as one batch of shards, and every shard as as many jobs as its lines need. A deployment
sets its own in place of the row (`model_info.native_max_lines`, `native_max_bytes`): lower, or higher where
the provider raised an account's quota (Bedrock's records per job). OpenAI's byte bound sits under its 200 MB,
a margin for the multipart form that carries the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class JobLimits:
    max_lines: int
    max_bytes: int
    source: str  # the provider's stated bound, for the docs and for whoever checks it again


JOB_LIMITS: Mapping[str, JobLimits] = MappingProxyType({
    "openai": JobLimits(50_000, 190_000_000, "50,000 requests and 200 MB per input file"),
    "azure": JobLimits(100_000, 190_000_000, "100,000 requests and 200 MB per input file"),
    "anthropic": JobLimits(100_000, 256_000_000, "100,000 requests or 256 MB per Message Batch"),
    "mistral": JobLimits(1_000_000, 512_000_000, "1,000,000 requests per job, 512 MB per input file"),
    "gemini": JobLimits(100_000, 2_000_000_000, "a 2 GB input file (inline requests: 20 MB)"),
    "vertex_ai": JobLimits(200_000, 1_000_000_000, "200,000 requests per job, a 1 GB input file"),
    "bedrock": JobLimits(50_000, 1_000_000_000, "50,000 records per job (quota), a 1 GB input file"),
    "groq": JobLimits(50_000, 100_000_000, "50,000 lines and 100 MB per input file"),
    "together_ai": JobLimits(50_000, 100_000_000, "50,000 requests and 100 MB per input file"),
    "fireworks_ai": JobLimits(1_000_000, 150_000_000, "a dataset under 500 MB (150 MB by one upload), no request cap"),
    "xai": JobLimits(100_000, 48_000_000, "100,000 requests per batch (more are throttled), 48 MB per file"),
})


def job_limits(provider: str) -> JobLimits:
    """The provider's row; a KeyError for a provider with no native jobs (the catalog checks every one has)."""
    return JOB_LIMITS[provider]


__all__ = ["JOB_LIMITS", "JobLimits", "job_limits"]
