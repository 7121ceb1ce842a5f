"""Amazon Bedrock batch inference (`UpstreamJobs`): chat lines as `{recordId, modelInput}` records in S3.

A Bedrock job runs one model over a JSONL file in S3 whose records are `{recordId, modelInput}`, `modelInput`
being the model's own InvokeModel body (Anthropic's Messages body, `anthropic_version: bedrock-2023-05-31`,
for `anthropic.claude-*`). `CreateModelInvocationJob` names the input object, an output S3 prefix and a
service role Bedrock assumes to read and write them; `GetModelInvocationJob` polls it (`Submitted`,
`Validating`, `Scheduled`, `InProgress`, `Completed`, `PartiallyCompleted`, `Failed`, `Stopping`,
`Stopped`, `Expired`); `StopModelInvocationJob` stops it. Bedrock writes each record back, with its
`modelOutput` or `error`, to `<output prefix>/<job id>/<input file name>.out`.

What is LiteLLM's: each line's translation into Claude's InvokeModel body (the steps of `BedrockFilesConfig.
_map_openai_to_bedrock_params`, the one LiteLLM's Bedrock batch files use: `AmazonAnthropicClaudeConfig`
after LiteLLM's parameter mapping, that mapping made once per distinct set of parameters) and each
`modelOutput` back into a `chat.completion` with usage (LiteLLM's Anthropic message translation). What is
ours: the S3 upload, the three job calls and the S3 download, with boto3 (botocore's SigV4, AWS's standard
credential chain and endpoints, `AWS_ENDPOINT_URL_S3`/`_BEDROCK` included; or the deployment's `aws_*` params).
LiteLLM 1.110.2's Bedrock batch calls upload through its own files API with its own S3 keys and do not stop jobs.

Limits (Bedrock's quotas): at least 100 and at most 50,000 records per job, 1 GB per input file; a job runs
within its timeout (24 hours by default), else `Expired`. A part below the minimum never goes to Bedrock:
`providers.native.runner` runs its lines in real time on the same deployment (`realtime`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import hashlib
import json
import os
import posixpath
from collections.abc import AsyncIterator
from typing import Any

from gateway.config.entries import NativeModelInfo
from gateway.domain import BatchRequest, Endpoint, Result
from providers.native.contract import (
    JobState,
    Save,
    TranslatedLines,
    UpstreamHTTPError,
    UpstreamJobs,
    translation_refusal,
)
from providers.native.openai_format import Part, call_with_retries, upstream_custom_id

_NOT_IN_BATCHES = frozenset({"stream", "stream_options"})
_STATUS = {"Submitted": "validating", "Validating": "validating", "Scheduled": "in_progress",
           "InProgress": "in_progress", "PartiallyCompleted": "completed", "Completed": "completed",
           "Failed": "failed", "Stopping": "cancelling", "Stopped": "cancelled", "Expired": "expired"}
_AWS_PARAMS = {"aws_access_key_id": "aws_access_key_id", "aws_secret_access_key": "aws_secret_access_key",
               "aws_session_token": "aws_session_token", "aws_region_name": "region_name"}


@functools.lru_cache(maxsize=32)
def _aws_clients(session_params: tuple[tuple[str, str], ...], aws_env: tuple[tuple[str, str], ...]) -> tuple[Any, Any]:
    """(s3, bedrock) boto3 clients of one set of `boto3.Session` params, made once per process: a jobs object is
    made per shard, and a session with its two clients costs ~0.1 s of CPU (botocore loads its service models).
    `aws_env`: the `AWS_*` environment the standard chain reads (endpoints, region, profile, keys), so a changed
    one makes new clients. boto3's clients are thread-safe (each call runs in `asyncio.to_thread`)."""
    import boto3

    session = boto3.session.Session(**dict(session_params))
    # endpoints: AWS's own, or AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL_BEDROCK (botocore's standard);
    # `api_base` stays what LiteLLM reads it as: the bedrock-runtime endpoint of the real-time calls
    return session.client("s3"), session.client("bedrock")


class BedrockJobs(TranslatedLines):
    """`bedrock/anthropic.claude-*` deployments: chat completions as Bedrock batch inference jobs."""

    providers = ("bedrock",)
    endpoints = frozenset({Endpoint.CHAT})
    min_lines = 100  # Bedrock's minimum records per job (`native_min_records`): a smaller part runs in real time
    settings = frozenset({"native_s3_bucket", "native_s3_prefix", "native_role_arn", "native_keep_files",
                          "native_min_records"})
    required_settings = ("native_s3_bucket", "native_role_arn")
    settings_purpose = "the S3 bucket and service role of Bedrock's batch jobs"
    credentials = (*UpstreamJobs.credentials, "aws_access_key_id", "aws_secret_access_key", "aws_session_token",
                   "aws_region_name")

    @classmethod
    def model_refusal(cls, model: str) -> str | None:
        if model.split(".", 1)[-1].startswith("anthropic.") or model.startswith("anthropic."):
            return None
        return f"runs anthropic.claude-* models only, not {model}"

    def __init__(self, litellm: Any, provider: str, model: str, kwargs: dict[str, Any],
                 info: NativeModelInfo) -> None:
        from litellm.llms.anthropic.chat.transformation import AnthropicConfig
        from litellm.llms.bedrock.chat.invoke_transformations.anthropic_claude_transformation import (
            AmazonAnthropicClaudeConfig,
        )

        if not info.native_s3_bucket or not info.native_role_arn:
            raise ValueError("a native Bedrock deployment needs model_info.native_s3_bucket and native_role_arn")
        super().__init__(litellm, provider, model, kwargs, info)
        self._bucket = info.native_s3_bucket
        self._prefix = info.native_s3_prefix.strip("/")
        self._role = info.native_role_arn
        self._keep = info.native_keep_files
        self.min_lines = info.native_min_records if info.native_min_records is not None else BedrockJobs.min_lines
        self._anthropic = AnthropicConfig()
        self._claude = AmazonAnthropicClaudeConfig()
        self._mapped: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}  # `_model_input`'s mapped parameters
        self._supported = set(AmazonAnthropicClaudeConfig().get_supported_openai_params(model)) - _NOT_IN_BATCHES
        self._clients: tuple[Any, Any] | None = None

    # -- lines --------------------------------------------------------------------------------------

    def url(self, endpoint: Endpoint) -> str:
        return endpoint.value

    def _model_input(self, body: dict[str, Any]) -> dict[str, Any]:
        """Claude's InvokeModel body of an OpenAI chat body: what LiteLLM's `BedrockFilesConfig.
        _map_openai_to_bedrock_params` makes for an Anthropic model, its own steps, with the parameter mapping
        (`get_optional_params`, which never reads the messages) made once per distinct set of parameters.

        That mapping walks LiteLLM's model map a dozen times a line (~1 ms: most of a Bedrock line's CPU), for
        the same answer on every line of a deployment that asks for the same parameters."""
        from litellm.llms.base_llm.base_utils import map_developer_role_to_system_role

        asked = {k: v for k, v in body.items() if k not in ("model", "messages") and v is not None}
        key = json.dumps(asked, sort_keys=True, default=repr)
        mapped = self._mapped.get(key)
        if mapped is None:
            mapped = self._mapped[key] = self._map_params(asked)
        optional, litellm_params = copy.deepcopy(mapped)  # LiteLLM's request builder may change what it is given
        model_input: dict[str, Any] = self._claude.transform_request(
            model=self._model, messages=map_developer_role_to_system_role(body.get("messages") or []),
            optional_params=optional, litellm_params=litellm_params, headers={})
        return model_input

    def release(self) -> None:
        super().release()
        self._mapped.clear()

    def _map_params(self, asked: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """(optional_params, litellm_params) of Claude's request for these OpenAI parameters: the Anthropic branch
        of LiteLLM's `_map_openai_to_bedrock_params`, with its own helpers."""
        from litellm.llms.bedrock.common_utils import (
            bedrock_batch_record_takes_native_output,
            deployment_model_info,
            without_bedrock_native_output_opt_in,
        )
        from litellm.llms.bedrock.files import transformation as files
        from litellm.types.utils import is_litellm_owned_kwarg
        from litellm.utils import get_optional_params

        route_model = files._invoke_route_model(self._model)
        litellm_params = without_bedrock_native_output_opt_in({"model_info": {
            "supports_native_structured_output": bedrock_batch_record_takes_native_output(
                route_model, asked.get("response_format"), None)}})
        mapped = get_optional_params(
            model=route_model, custom_llm_provider="bedrock", messages=None,
            model_info=deployment_model_info(litellm_params),
            **files._ParamsTheMapperOwns(**{k: v for k, v in asked.items() if not is_litellm_owned_kwarg(k)
                                            or k in files._LITELLM_PARAMS_THE_MAPPER_TAKES}))
        optional = {k: v for k, v in mapped.items() if k not in files._MAPPED_PARAMS_THE_REQUEST_HANDLER_STRIPS}
        return optional, dict(litellm_params)

    def _translate(self, req: BatchRequest) -> bytes:
        entry = {"recordId": upstream_custom_id(req.line), "modelInput": self._model_input(req.body)}
        return json.dumps(entry, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"

    def reject(self, req: BatchRequest) -> Result | None:
        """A parameter Bedrock has no counterpart for, or messages LiteLLM cannot translate: a 400 for that line."""
        return translation_refusal(req, self._supported, f"{self._model} in Bedrock",
                                   lambda body: self.line(req))  # translated once: the line keeps it

    # -- AWS --------------------------------------------------------------------------------------------

    def _aws(self) -> tuple[Any, Any]:
        """(s3, bedrock) boto3 clients: the deployment's `aws_*` params, else AWS's standard chain."""
        if self._clients is None:
            params = tuple((name, str(self._kwargs[key])) for key, name in _AWS_PARAMS.items() if self._kwargs.get(key))
            aws_env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
            self._clients = _aws_clients(params, aws_env)
        return self._clients

    async def _call(self, which: int, method: str, **kwargs: Any) -> Any:
        """One boto3 call off the event loop; an AWS error raised as `UpstreamHTTPError` with its status."""
        from botocore.exceptions import ClientError

        client = self._aws()[which]
        try:
            return await asyncio.to_thread(getattr(client, method), **kwargs)
        except ClientError as exc:
            error = exc.response.get("Error") or {}
            status = int((exc.response.get("ResponseMetadata") or {}).get("HTTPStatusCode") or 500)
            raise UpstreamHTTPError(status, f"{error.get('Code', '')}: {error.get('Message', '')}") from None

    def _key(self, name: str) -> str:
        return posixpath.join(self._prefix, "input", name) if self._prefix else f"input/{name}"

    async def create(self, part: Part, data: bytes, name: str, metadata: dict[str, str], save: Save) -> None:
        if part.file_id is None:
            key = self._key(name)
            await call_with_retries(lambda: self._call(0, "put_object", Bucket=self._bucket, Key=key, Body=data))
            part.file_id = key
            await save()
        key = part.file_id
        out = posixpath.join(self._prefix, "output") if self._prefix else "output"
        job_name = name.removesuffix(".jsonl")[-63:].replace("_", "-")
        # Bedrock makes one job per clientRequestToken: a create retried after a crash gets the same job back.
        token = hashlib.sha256(key.encode()).hexdigest()[:32]
        reply = await call_with_retries(lambda: self._call(
            1, "create_model_invocation_job", jobName=job_name, roleArn=self._role, modelId=self._model,
            clientRequestToken=token,
            inputDataConfig={"s3InputDataConfig": {"s3Uri": f"s3://{self._bucket}/{key}", "s3InputFormat": "JSONL"}},
            outputDataConfig={"s3OutputDataConfig": {"s3Uri": f"s3://{self._bucket}/{out}/"}}))
        part.batch_id = str(reply["jobArn"])

    async def find(self, part: Part) -> bool:
        return False  # the create retried with the same clientRequestToken returns the job it made

    async def retrieve(self, batch_id: str) -> JobState:
        job = await self._call(1, "get_model_invocation_job", jobIdentifier=batch_id)
        status = _STATUS.get(str(job.get("status")), "in_progress")
        source = str(job["inputDataConfig"]["s3InputDataConfig"]["s3Uri"])
        output = str(job["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"]).rstrip("/")
        job_id = batch_id.rsplit("/", 1)[-1]
        files = [source, f"{output}/{job_id}/{posixpath.basename(source)}.out", f"{output}/{job_id}/manifest.json.out"]
        return JobState(status=status, files=files, why=str(job.get("message") or ""))

    async def results(self, state: JobState) -> AsyncIterator[dict[str, Any]]:
        source, output, manifest = state.files
        if state.status == "completed":
            bucket, _, key = output.removeprefix("s3://").partition("/")
            reply = await self._call(0, "get_object", Bucket=bucket, Key=key)
            body = reply["Body"]
            lines = await asyncio.to_thread(lambda: list(body.iter_lines()))
            for raw in lines:
                if raw.strip():
                    yield self._result(json.loads(raw))
        if not self._keep:  # the batch's inputs and outputs leave the bucket with it
            for uri in (source, output, manifest):
                bucket, _, key = uri.removeprefix("s3://").partition("/")
                await self._call(0, "delete_object", Bucket=bucket, Key=key)

    def _result(self, record: dict[str, Any]) -> dict[str, Any]:
        from providers.native.anthropic_jobs import chat_completion_body

        custom_id = str(record.get("recordId"))
        output = record.get("modelOutput")
        if isinstance(output, dict) and record.get("error") is None:
            body = chat_completion_body(output, self._anthropic)
            body["model"] = self._model
            return {"custom_id": custom_id, "response": {"status_code": 200, "body": body,
                                                         "request_id": output.get("id")}}
        error = record.get("error") or {}
        status = int(error.get("errorCode") or 500)
        body = {"error": {"message": str(error.get("errorMessage") or ""), "type": "invalid_request_error"
                          if status == 400 else "api_error", "param": None, "code": str(status)}}
        return {"custom_id": custom_id, "response": {"status_code": status, "body": body}}

    async def realtime(self, req: BatchRequest) -> Result:
        """A line of a part below Bedrock's minimum records, answered by one real-time call (LiteLLM's
        `acompletion` on the same deployment, at its real-time price)."""
        from providers.native.openai_format import result_from_line
        from providers.upstream_errors import describe_error

        # only the chat fields `reject` let through: nothing in a line names a key, an endpoint or a setting
        body = {k: v for k, v in req.body.items() if k == "messages" or k in self._supported}
        kwargs = {k: v for k, v in self._kwargs.items() if k not in ("custom_llm_provider", "api_key")}
        try:
            reply = await self._litellm.acompletion(model=f"bedrock/{self._model}", **body, **kwargs)
        except Exception as exc:
            status = getattr(exc, "status_code", None)
            if not isinstance(status, int):
                return Result.failure(req.line, req.custom_id, "upstream_error", describe_error(exc), model=req.model)
            return Result.http_error(req.line, req.custom_id, status, describe_error(exc), code=str(status),
                                     type_="invalid_request_error" if status == 400 else "api_error", model=req.model)
        result = result_from_line({"custom_id": req.custom_id, "response": {
            "status_code": 200, "body": reply.model_dump(exclude_none=True)}}, req)
        with contextlib.suppress(Exception):  # a model LiteLLM's map does not price: no cost, as in real time
            result.cost_usd = float(self._litellm.completion_cost(completion_response=reply))
        return result

    async def cancel(self, batch_id: str) -> None:
        await self._call(1, "stop_model_invocation_job", jobIdentifier=batch_id)
