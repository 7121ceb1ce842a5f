"""A stand-in for Amazon Bedrock's batch inference (and the runtime calls) on loopback, over moto's S3
(`python -m tests.fakes.stubs_bedrock --s3-endpoint URL`).

Written from AWS's API reference (Amazon Bedrock API Reference: CreateModelInvocationJob,
GetModelInvocationJob, StopModelInvocationJob; the batch inference user guide's record format), not from what
LiteLLM sends. The control plane, REST-JSON as botocore's `bedrock` model describes it: `POST
/model-invocation-job` (`jobName`, `roleArn`, `modelId`, `inputDataConfig.s3InputDataConfig.s3Uri`,
`outputDataConfig.s3OutputDataConfig.s3Uri` required; `clientRequestToken` makes the call idempotent) →
`{jobArn}`; `GET /model-invocation-job/{jobIdentifier}`; `POST /model-invocation-job/{jobIdentifier}/stop`.
Every call must be SigV4-signed (an `Authorization: AWS4-HMAC-SHA256 ...` header). Errors: HTTP status,
`x-amzn-ErrorType` and `{"message"}` (ValidationException 400, ResourceNotFoundException 404,
AccessDeniedException 403).

A job reads its JSONL input from S3 (moto), each record `{recordId, modelInput}` with `modelInput` Anthropic's
Messages body for Bedrock (`anthropic_version: bedrock-2023-05-31` and `max_tokens` required, no `model`,
roles user/assistant); fewer than `--min-records` (100) records or more than 50,000 fail the job
(`Failed`, with Bedrock's message). After `--batch-delay` seconds it writes `<output>/<job id>/<input
name>.out` (one `{recordId, modelInput, modelOutput | error}` per record) and `manifest.json.out`, and ends
`Completed` (`PartiallyCompleted` when a record errored). Directives: `#fail:CODE` errors that record with
`errorCode` CODE; `#batch:expire` / `#batch:fail` end the job `Expired` / `Failed`.

The runtime: `POST /model/{modelId}/invoke` (the same Messages body, one message back) and `/converse`
(Bedrock's Converse request and reply), for the lines a native route runs in real time.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import urllib.parse
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.stub_process import bill, directive, serve, stub_arguments, text_of, words

MAX_RECORDS = 50_000
_ROLE = re.compile(r"^arn:aws(-[^:]+)?:iam::([0-9]{12})?:role/.+$")
_ACCOUNT = "123456789012"


class ApiError(Exception):
    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind, self.message = status, kind, message


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _split(uri: str) -> tuple[str, str]:
    if not uri.startswith("s3://"):
        raise ApiError(400, "ValidationException", f"{uri} is not an S3 URI")
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return bucket, key


class BedrockStub:
    def __init__(self, batch_delay: float, s3_endpoint: str, min_records: int) -> None:
        import boto3

        self.batch_delay, self.min_records = batch_delay, min_records
        self.s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                               aws_access_key_id="testing", aws_secret_access_key="testing")
        self.jobs: dict[str, dict[str, Any]] = {}  # job id -> GetModelInvocationJob's reply
        self.tokens: dict[str, str] = {}  # clientRequestToken -> job id
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.counters: Counter[str] = Counter()
        self.inputs_seen: list[dict[str, Any]] = []

    def _check(self, request: Request) -> None:
        if not request.headers.get("authorization", "").startswith("AWS4-HMAC-SHA256 Credential="):
            raise ApiError(403, "AccessDeniedException", "Missing Authentication Token (a SigV4 signature)")

    def _job(self, identifier: str) -> dict[str, Any]:
        job_id = urllib.parse.unquote(identifier).rsplit("/", 1)[-1]
        job = self.jobs.get(job_id)
        if job is None:
            raise ApiError(404, "ResourceNotFoundException", f"The specified job {identifier} was not found.")
        return job

    async def dispatch(self, request: Request) -> Response:
        try:
            self._check(request)
            path, method = request.url.path, request.method
            if path == "/model-invocation-job" and method == "POST":
                return await self.create(json.loads(await request.body()))
            if path.startswith("/model-invocation-job/"):
                tail = request.path_params.get("rest", "")
                if tail.endswith("/stop") and method == "POST":
                    return self.stop(self._job(tail.removesuffix("/stop")))
                if method == "GET":
                    return JSONResponse(self._job(tail))
            if path.startswith("/model/") and method == "POST":
                return self.runtime(path, json.loads(await request.body()))
            raise ApiError(404, "UnknownOperationException", f"{method} {path}")
        except ApiError as exc:
            return JSONResponse({"message": exc.message}, status_code=exc.status,
                                headers={"x-amzn-ErrorType": exc.kind})

    async def create(self, body: dict[str, Any]) -> Response:
        for name in ("jobName", "roleArn", "modelId", "inputDataConfig", "outputDataConfig"):
            if not body.get(name):
                raise ApiError(400, "ValidationException", f"1 validation error detected: {name} must not be null")
        if not _ROLE.match(str(body["roleArn"])):
            raise ApiError(400, "ValidationException", f"roleArn {body['roleArn']!r} is not an IAM role ARN")
        token = body.get("clientRequestToken")
        if token and token in self.tokens:  # idempotent: the job this token made
            return JSONResponse({"jobArn": self.jobs[self.tokens[token]]["jobArn"]})
        source = body["inputDataConfig"]["s3InputDataConfig"]["s3Uri"]
        output = body["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"]
        _split(output)
        job_id = secrets.token_hex(6)
        arn = f"arn:aws:bedrock:us-east-1:{_ACCOUNT}:model-invocation-job/{job_id}"
        job = {"jobArn": arn, "jobName": body["jobName"], "modelId": body["modelId"], "roleArn": body["roleArn"],
               "status": "Submitted", "submitTime": _now(), "lastModifiedTime": _now(),
               "inputDataConfig": body["inputDataConfig"], "outputDataConfig": body["outputDataConfig"]}
        if token:
            job["clientRequestToken"] = token
            self.tokens[token] = job_id
        self.jobs[job_id] = job
        self.counters["batches_created"] += 1
        self.tasks[job_id] = asyncio.get_running_loop().create_task(self._run(job_id, source, output))
        return JSONResponse({"jobArn": arn})

    def stop(self, job: dict[str, Any]) -> Response:
        if job["status"] in ("Completed", "PartiallyCompleted", "Failed", "Stopped", "Expired"):
            raise ApiError(400, "ValidationException", f"Job {job['jobArn']} has already ended ({job['status']}).")
        self.counters["cancels"] += 1
        job_id = job["jobArn"].rsplit("/", 1)[-1]
        self.tasks[job_id].cancel()
        job.update(status="Stopped", endTime=_now(), lastModifiedTime=_now())
        return JSONResponse({})

    def _fail(self, job: dict[str, Any], status: str, message: str) -> None:
        job.update(status=status, message=message, endTime=_now(), lastModifiedTime=_now())

    async def _run(self, job_id: str, source: str, output: str) -> None:
        job = self.jobs[job_id]
        job["status"] = "Validating"
        bucket, key = _split(source)
        try:
            raw = await asyncio.to_thread(lambda: self.s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        except Exception as exc:
            self._fail(job, "Failed", f"Unable to read the input file {source}: {exc}")
            return
        records = [json.loads(line) for line in raw.splitlines() if line.strip()]
        if len(records) < self.min_records or len(records) > MAX_RECORDS:
            self._fail(job, "Failed", f"The number of records in the input files is {len(records)}: a job takes "
                                      f"{self.min_records} to {MAX_RECORDS} records.")
            return
        for i, record in enumerate(records):
            problem = _invalid(record)
            if problem:
                self._fail(job, "Failed", f"Invalid record {i + 1}: {problem}")
                return
        self.inputs_seen.extend(r["modelInput"] for r in records)
        self.counters["batch_requests"] += len(records)
        job["status"] = "InProgress"
        await asyncio.sleep(self.batch_delay)
        text = raw.decode()
        if "#batch:expire" in text or "#batch:fail" in text:
            expired = "#batch:expire" in text
            self._fail(job, "Expired" if expired else "Failed",
                       "The job timed out." if expired else "Job failed (#batch:fail directive).")
            return
        lines, errors = [], 0
        for record in records:
            answer = _answer(record["modelInput"], job["modelId"])
            bill(self.counters, (answer.get("modelOutput") or {}).get("usage"))
            errors += "error" in answer
            lines.append(json.dumps({"recordId": record["recordId"], "modelInput": record["modelInput"], **answer}))
        out_bucket, out_key = _split(output.rstrip("/") + f"/{job_id}/{key.rsplit('/', 1)[-1]}.out")
        manifest = {"totalRecordCount": len(records), "processedRecordCount": len(records),
                    "successRecordCount": len(records) - errors, "errorRecordCount": errors}
        await asyncio.to_thread(lambda: self.s3.put_object(Bucket=out_bucket, Key=out_key,
                                                           Body=("\n".join(lines) + "\n").encode()))
        await asyncio.to_thread(lambda: self.s3.put_object(
            Bucket=out_bucket, Key=out_key.rsplit("/", 1)[0] + "/manifest.json.out", Body=json.dumps(manifest)))
        job.update(status="PartiallyCompleted" if errors else "Completed", endTime=_now(), lastModifiedTime=_now())

    def runtime(self, path: str, body: dict[str, Any]) -> Response:
        model = urllib.parse.unquote(path.removeprefix("/model/").rsplit("/", 1)[0])
        self.counters["realtime"] += 1
        if path.endswith("/invoke"):
            problem = _invalid({"recordId": "r", "modelInput": body})
            if problem:
                raise ApiError(400, "ValidationException", problem)
            answer = _answer(body, model)
            if "error" in answer:
                error = answer["error"]
                raise ApiError(int(error["errorCode"]), "ValidationException", error["errorMessage"])
            return JSONResponse(answer["modelOutput"])
        if path.endswith("/converse"):
            messages = body.get("messages") or []
            text = " ".join(str(c.get("text", "")) for c in (messages[-1].get("content") or [])) if messages else ""
            prompt = sum(words(" ".join(str(c.get("text", "")) for c in m.get("content") or [])) for m in messages)
            prompt += sum(words(str(s.get("text", ""))) for s in body.get("system") or [])
            reply = f"echo: {text}"
            return JSONResponse({"output": {"message": {"role": "assistant", "content": [{"text": reply}]}},
                                 "stopReason": "end_turn", "metrics": {"latencyMs": 1},
                                 "usage": {"inputTokens": prompt, "outputTokens": words(reply),
                                           "totalTokens": prompt + words(reply)}})
        raise ApiError(404, "UnknownOperationException", path)

    def stats(self) -> dict[str, Any]:
        return {**self.counters, "inputs_seen": self.inputs_seen}


def _invalid(record: Any) -> str | None:
    if not isinstance(record, dict) or set(record) != {"recordId", "modelInput"}:
        return "a record is {recordId, modelInput}"
    body = record["modelInput"]
    if not isinstance(body, dict) or body.get("anthropic_version") != "bedrock-2023-05-31":
        return "modelInput.anthropic_version must be bedrock-2023-05-31"
    if "model" in body:
        return "modelInput: extraneous key [model] is not permitted (the job names the model)"
    if not isinstance(body.get("max_tokens"), int) or not isinstance(body.get("messages"), list):
        return "modelInput: max_tokens and messages are required"
    if any(m.get("role") not in ("user", "assistant") for m in body["messages"]):
        return "modelInput.messages: roles must be user or assistant (the system prompt is `system`)"
    return None


def _answer(body: dict[str, Any], model: str) -> dict[str, Any]:
    user = [m for m in body["messages"] if m.get("role") == "user"]
    text = text_of(user[-1].get("content")) if user else ""
    failure = directive(text, "fail")
    if failure is not None:
        return {"error": {"errorCode": int(failure or 500), "errorMessage": f"Record failed (#fail:{failure})."}}
    reply = f"echo: {text}"
    prompt = sum(words(text_of(m.get("content"))) for m in body["messages"]) + words(text_of(body.get("system")))
    return {"modelOutput": {"id": "msg_bdrk_" + secrets.token_hex(8), "type": "message", "role": "assistant",
                            "model": model, "content": [{"type": "text", "text": reply}], "stop_reason": "end_turn",
                            "stop_sequence": None, "usage": {"input_tokens": prompt, "output_tokens": words(reply)}}}


def build_app(stub: BedrockStub) -> Starlette:
    async def stats(request: Request) -> Response:
        return JSONResponse(stub.stats())

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[
        Route("/_health", health), Route("/_stats", stats),
        Route("/model-invocation-job", stub.dispatch, methods=["POST"]),
        Route("/model-invocation-job/{rest:path}", stub.dispatch, methods=["GET", "POST"]),
        Route("/model/{rest:path}", stub.dispatch, methods=["POST"]),
    ])


def main() -> None:
    parser = stub_arguments("python -m tests.fakes.stubs_bedrock", "Amazon Bedrock batch inference stand-in.")
    parser.add_argument("--s3-endpoint", required=True, help="the S3 endpoint (moto's server) jobs read and write")
    parser.add_argument("--min-records", type=int, default=100, help="records per job at least")
    args = parser.parse_args()
    serve(build_app(BedrockStub(args.batch_delay, args.s3_endpoint, args.min_records)), args)


if __name__ == "__main__":
    main()
