"""A stand-in for Fireworks AI's batch inference API on loopback (`python -m tests.fakes.stubs_fireworks`).

Written from Fireworks' reference (docs.fireworks.ai: the batch inference guide; API reference "Create Dataset",
"Upload Dataset Files", "Get Dataset", "Get Dataset Download Endpoint", "Create/Get/List/Delete Batch Inference
Job"), strict where it is:
- `Authorization: Bearer <key>` on every control-plane call (403 otherwise); errors `{"code", "message"}` (gRPC's
  status words: `INVALID_ARGUMENT` 400, `NOT_FOUND` 404, `ALREADY_EXISTS` 409).
- Everything under `/v1/accounts/{account}/`; another account than `--account` is 404.
- `POST datasets` `{datasetId, dataset: {userUploaded: {}, exampleCount}}`: an id of lower-case letters, digits
  and hyphens (at most 63), `exampleCount` required for an uploaded dataset; the dataset is `UPLOADING`.
  `POST datasets/{id}:upload` multipart `file` (at most 150 MB), once: the dataset is `READY`. `GET datasets/{id}`.
- `GET datasets/{id}:getDownloadEndpoint` (no body): `{filenameToSignedUrls}`, each a signed URL on this server
  (`/_signed/...`) that takes no Authorization header (a signed URL refuses one, as Cloud Storage's do).
- `POST batchInferenceJobs?batchInferenceJobId=ID` `{model, inputDatasetId, outputDatasetId, displayName,
  inferenceParameters, precision, continuedFromJobName}` (anything else 400): datasets named by their resource
  names (`accounts/{account}/datasets/{id}`), the input `READY`; an id taken is 409. `GET batchInferenceJobs/{id}`,
  `GET batchInferenceJobs` (`{batchInferenceJobs, nextPageToken}`), `DELETE batchInferenceJobs/{id}` (there is no
  cancel: a running job is stopped, `JOB_STATE_DELETING_CLEANING_UP`).
- A job: `name`, `displayName`, `createTime`, `state` (`JOB_STATE_VALIDATING` -> `JOB_STATE_RUNNING` ->
  `JOB_STATE_COMPLETED`; `JOB_STATE_FAILED`, `JOB_STATE_EXPIRED`), `status: {code, message}`, `model`,
  `inputDatasetId`, `outputDatasetId`, `jobProgress`.
- Input lines: `{custom_id, body}` only (custom_id unique; body a chat request with `messages` and no `model`:
  the job names it). A dataset that breaks these fails the job in validation (`JOB_STATE_FAILED`, the reason in
  `status.message`).
- Output dataset files: `BIJOutputSet.jsonl`, `{custom_id, response: <chat.completion>}` per answered request (no
  `status_code` wrapper); `error-data`, `{custom_id, error: {message, code}}` per failed one.

A job ends `--batch-delay` seconds after validation, each request answered "echo: <last user text>" (tokens:
whitespace words). Directives in a request's text: `#fail:CODE` puts that request in `error-data` with CODE;
`#batch:fail` fails the job, `#batch:expire` expires it (neither writes an output dataset).
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.stub_process import (
    bill,
    control_routes,
    directive,
    last_user_text,
    serve,
    stub_arguments,
    text_of,
    words,
)

MAX_UPLOAD = 150 * 1024 * 1024
JOB_FIELDS = {"model", "inputDatasetId", "outputDatasetId", "displayName", "inferenceParameters", "precision",
              "continuedFromJobName"}
RESOURCE_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_STATUS = {400: "INVALID_ARGUMENT", 403: "PERMISSION_DENIED", 404: "NOT_FOUND", 409: "ALREADY_EXISTS"}


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


def _iso() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


class FireworksStub:
    def __init__(self, batch_delay: float, api_key: str | None, account: str) -> None:
        self.batch_delay, self.api_key, self.account = batch_delay, api_key, account
        self.datasets: dict[str, dict[str, Any]] = {}
        self.data: dict[str, dict[str, bytes]] = {}  # dataset id -> its files
        self.jobs: dict[str, dict[str, Any]] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.signed: dict[str, bytes] = {}
        self.counters: Counter[str] = Counter()

    def _check(self, request: Request) -> None:
        auth = request.headers.get("authorization", "")
        if not auth.startswith("Bearer ") or (self.api_key is not None and auth[7:] != self.api_key):
            raise ApiError(403, "The API key you provided is invalid.")

    async def dispatch(self, request: Request) -> Response:
        try:
            self._check(request)
            prefix = f"/v1/accounts/{self.account}/"
            path, method = request.url.path, request.method
            if not path.startswith(prefix):
                raise ApiError(404, "resource not found")
            rest = path.removeprefix(prefix)
            if rest == "datasets" and method == "POST":
                return await self.create_dataset(request)
            if rest.startswith("datasets/") and rest.endswith(":upload") and method == "POST":
                return await self.upload(request, rest.removeprefix("datasets/").removesuffix(":upload"))
            if rest.startswith("datasets/") and rest.endswith(":getDownloadEndpoint") and method == "GET":
                if await request.body():
                    raise ApiError(400, "a GET takes no body")
                return self.download(request, rest.removeprefix("datasets/").removesuffix(":getDownloadEndpoint"))
            if rest.startswith("datasets/") and method == "GET":
                return JSONResponse(self._dataset(rest.removeprefix("datasets/")))
            if rest == "batchInferenceJobs" and method == "POST":
                return await self.create_job(request)
            if rest == "batchInferenceJobs" and method == "GET":
                return JSONResponse({"batchInferenceJobs": list(reversed(self.jobs.values())), "nextPageToken": ""})
            if rest.startswith("batchInferenceJobs/") and method in ("GET", "DELETE"):
                job = self._job(rest.removeprefix("batchInferenceJobs/"))
                return JSONResponse(job) if method == "GET" else self.delete(job)
            raise ApiError(404, f"resource not found: {method} {path}")
        except ApiError as exc:
            return JSONResponse({"code": _STATUS.get(exc.status, "UNKNOWN"), "message": exc.message},
                                status_code=exc.status)

    def _dataset(self, rid: str) -> dict[str, Any]:
        dataset = self.datasets.get(rid)
        if dataset is None:
            raise ApiError(404, "resource not found")
        return dataset

    def _job(self, job_id: str) -> dict[str, Any]:
        job = self.jobs.get(job_id)
        if job is None:
            raise ApiError(404, "resource not found")
        return job

    # -- datasets ------------------------------------------------------------------------------------

    async def create_dataset(self, request: Request) -> Response:
        body = _json(await request.body())
        unknown = sorted(set(body) - {"datasetId", "dataset", "sourceDatasetId", "filter"})
        if unknown:
            raise ApiError(400, f'unknown field "{unknown[0]}"')
        rid, spec = body.get("datasetId"), body.get("dataset")
        if not isinstance(rid, str) or not RESOURCE_ID.match(rid):
            raise ApiError(400, "datasetId: lower-case letters, digits and hyphens, at most 63")
        if not isinstance(spec, dict) or "userUploaded" not in spec:
            raise ApiError(400, "dataset: a source (userUploaded) is required")
        if not isinstance(spec.get("exampleCount"), str) or not spec["exampleCount"].isdigit():
            raise ApiError(400, "example_count is required for uploaded datasets")
        if rid in self.datasets:
            raise ApiError(409, f"dataset {rid} already exists")
        dataset = {"name": f"accounts/{self.account}/datasets/{rid}", "createTime": _iso(), "state": "UPLOADING",
                   "status": {"code": "OK", "message": ""}, "exampleCount": spec["exampleCount"], "userUploaded": {},
                   "format": "CHAT"}
        self.datasets[rid] = dataset
        self.counters["datasets_created"] += 1
        return JSONResponse(dataset)

    async def upload(self, request: Request, rid: str) -> Response:
        dataset = self._dataset(rid)
        if dataset["state"] != "UPLOADING":
            raise ApiError(400, f"dataset {rid} is {dataset['state']}: its files are uploaded")
        form = await request.form(max_part_size=MAX_UPLOAD + 1)
        upload = form.get("file")
        if upload is None or isinstance(upload, str):
            raise ApiError(400, "file: field required")
        data = await upload.read()
        if len(data) > MAX_UPLOAD:
            raise ApiError(400, "file: larger than 150 MB (use the upload endpoint)")
        self.data[rid] = {upload.filename or "input.jsonl": data}
        dataset["state"] = "READY"
        self.counters["uploads"] += 1
        return JSONResponse({"id": rid, "object": "file", "bytes": len(data), "created_at": int(time.time()),
                             "filename": upload.filename, "purpose": "dataset"})

    def download(self, request: Request, rid: str) -> Response:
        self._dataset(rid)
        urls = {}
        for filename, data in self.data.get(rid, {}).items():
            token = secrets.token_hex(12)
            self.signed[token] = data
            urls[f"dataset/{rid}/{filename}"] = f"{request.base_url}_signed/{token}?X-Goog-Expires=599"
        return JSONResponse({"filenameToSignedUrls": urls})

    async def signed_get(self, request: Request) -> Response:
        if "authorization" in request.headers:
            return Response("a signed URL takes no Authorization header", status_code=400)
        data = self.signed.get(request.path_params["token"])
        if data is None:
            return Response("NoSuchKey", status_code=404)
        return Response(data, media_type="application/octet-stream")

    # -- jobs ----------------------------------------------------------------------------------------

    async def create_job(self, request: Request) -> Response:
        body = _json(await request.body())
        unknown = sorted(set(body) - JOB_FIELDS)
        if unknown:
            raise ApiError(400, f'unknown field "{unknown[0]}"')
        job_id = request.query_params.get("batchInferenceJobId") or "job-" + secrets.token_hex(6)
        if not RESOURCE_ID.match(job_id):
            raise ApiError(400, "batchInferenceJobId: lower-case letters, digits and hyphens, at most 63")
        if job_id in self.jobs:
            raise ApiError(409, f"batch inference job {job_id} already exists")
        if not isinstance(body.get("model"), str) or not body["model"].startswith("accounts/"):
            raise ApiError(400, "model: an account-qualified model name (accounts/.../models/...) is required")
        source = self._dataset_of(body.get("inputDatasetId"), "inputDatasetId")
        if self.datasets.get(source, {}).get("state") != "READY":
            raise ApiError(400 if source in self.datasets else 404, f"inputDatasetId: dataset {source} is not READY")
        output = self._dataset_of(body.get("outputDatasetId") or self._name(f"{job_id}-output"), "outputDatasetId")
        if output in self.datasets:
            raise ApiError(409, f"outputDatasetId: dataset {output} already exists")
        job = {"name": f"accounts/{self.account}/batchInferenceJobs/{job_id}", "displayName": body.get("displayName"),
               "createTime": _iso(), "createdBy": "stub@example.com", "state": "JOB_STATE_VALIDATING",
               "status": {"code": "OK", "message": ""}, "model": body["model"],
               "inputDatasetId": self._name(source), "outputDatasetId": self._name(output),
               "inferenceParameters": body.get("inferenceParameters") or {"extraBody": "{}"}, "updateTime": _iso(),
               "jobProgress": {"percent": 0}}
        self.jobs[job_id] = job
        self.counters["jobs_created"] += 1
        data = b"".join(self.data[source].values())
        self.tasks[job_id] = asyncio.get_running_loop().create_task(self._run(job_id, job, data, output))
        return JSONResponse(job)

    def _name(self, rid: str) -> str:
        return f"accounts/{self.account}/datasets/{rid}"

    def _dataset_of(self, name: Any, field: str) -> str:
        prefix = f"accounts/{self.account}/datasets/"
        if not isinstance(name, str) or not name.startswith(prefix) or not RESOURCE_ID.match(name[len(prefix):]):
            raise ApiError(400, f"{field}: a dataset resource name ({prefix}ID) is required")
        return name[len(prefix):]

    def delete(self, job: dict[str, Any]) -> Response:
        task = self.tasks.pop(job["name"].rsplit("/", 1)[-1], None)
        if task is not None:
            task.cancel()
        self.counters["deletes"] += 1
        job.update(state="JOB_STATE_DELETING_CLEANING_UP", updateTime=_iso())
        return JSONResponse({})

    async def _run(self, job_id: str, job: dict[str, Any], data: bytes, output: str) -> None:
        await asyncio.sleep(min(0.1, self.batch_delay))
        try:
            requests = _validate(data)
        except ApiError as exc:
            job.update(state="JOB_STATE_FAILED", status={"code": "INVALID_ARGUMENT", "message": exc.message})
            return
        job["state"] = "JOB_STATE_RUNNING"
        self.counters["batch_lines"] += len(requests)
        await asyncio.sleep(self.batch_delay)
        text = json.dumps(requests)
        if "#batch:fail" in text or "#batch:expire" in text:
            failed = "#batch:fail" in text
            job.update(state="JOB_STATE_FAILED" if failed else "JOB_STATE_EXPIRED",
                       status={"code": "INTERNAL" if failed else "DEADLINE_EXCEEDED",
                               "message": "The job failed (#batch:fail directive)." if failed else "job expired"})
            return
        outputs, errors = [], []
        for item in requests:
            answer = _answer(item["body"], job["model"])
            if "error" in answer:
                errors.append({"custom_id": item["custom_id"], **answer})
            else:
                bill(self.counters, answer["usage"])
                outputs.append({"custom_id": item["custom_id"], "response": answer})
        self.datasets[output] = {"name": self._name(output), "createTime": _iso(), "state": "READY",
                                 "status": {"code": "OK", "message": ""}, "exampleCount": str(len(outputs)),
                                 "format": "CHAT", "sourceJobName": job["name"]}
        self.data[output] = {"BIJOutputSet.jsonl": "".join(json.dumps(o) + "\n" for o in outputs).encode(),
                             "error-data": "".join(json.dumps(e) + "\n" for e in errors).encode()}
        job.update(state="JOB_STATE_COMPLETED", updateTime=_iso(),
                   jobProgress={"percent": 100, "totalInputRequests": len(requests),
                                "totalProcessedRequests": len(requests),
                                "successfullyProcessedRequests": len(outputs), "failedRequests": len(errors),
                                "outputRows": len(outputs)})
        self.tasks.pop(job_id, None)

    def stats(self) -> dict[str, Any]:
        return dict(self.counters)

    def reset(self) -> None:
        self.counters.clear()


def _json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError:
        raise ApiError(400, "the body is not JSON") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be an object")
    return body


def _validate(data: bytes) -> list[dict[str, Any]]:
    requests: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, raw in enumerate(data.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            item = json.loads(raw)
        except ValueError:
            raise ApiError(400, f"Dataset has a syntax error: line {number} is not JSON") from None
        if not isinstance(item, dict) or set(item) != {"custom_id", "body"}:
            raise ApiError(400, f"Dataset has a syntax error: line {number}: custom_id and body are required")
        custom_id, body = item["custom_id"], item["body"]
        if not isinstance(custom_id, str) or not custom_id or custom_id in seen:
            raise ApiError(400, f"Dataset has a syntax error: line {number}: custom_id must be unique")
        seen.add(custom_id)
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            raise ApiError(400, f"chat dataset validation failed on line {number}: messages are required")
        if "model" in body:
            raise ApiError(400, f"chat dataset validation failed on line {number}: the job names the model")
        requests.append(item)
    if not requests:
        raise ApiError(400, "the input dataset has no rows")
    return requests


def _answer(body: dict[str, Any], model: str) -> dict[str, Any]:
    text = last_user_text(body["messages"])
    failure = directive(text, "fail")
    if failure is not None:
        return {"error": {"message": f"Request failed (#fail:{failure} directive).", "code": failure or "error"}}
    reply = f"echo: {text}"
    prompt = sum(words(text_of(m.get("content"))) for m in body["messages"])
    usage = {"prompt_tokens": prompt, "completion_tokens": words(reply), "total_tokens": prompt + words(reply)}
    return {"id": "chatcmpl-" + secrets.token_hex(8), "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                                         "finish_reason": "stop"}], "usage": usage}


def build_app(stub: FireworksStub) -> Starlette:
    return Starlette(routes=[
        *control_routes(stub),
        Route("/_signed/{token}", stub.signed_get),
        Route("/v1/{rest:path}", stub.dispatch, methods=["GET", "POST", "DELETE"]),
    ])


def main() -> None:
    parser = stub_arguments("python -m tests.fakes.stubs_fireworks", "Fireworks AI batch inference stand-in for tests.")
    parser.add_argument("--account", default="batchyard-test", help="the one account the stand-in serves")
    args = parser.parse_args()
    serve(build_app(FireworksStub(args.batch_delay, args.api_key, args.account)), args)


if __name__ == "__main__":
    main()
