"""A stand-in for Vertex AI batch prediction (Gemini models) on loopback, over a real Cloud Storage emulator
(`python -m tests.fakes.stubs_vertex --gcs-endpoint URL`; gcp-storage-emulator's JSON API).

Written from Google's references (Vertex AI REST v1 `projects.locations.batchPredictionJobs`: create, get, list,
cancel; "Batch prediction for Gemini": the input and output row formats; OAuth 2.0's token endpoint), not from
what LiteLLM sends. Auth: every API call needs `Authorization: Bearer <token>` of a token this server issued at
`POST /token` (the `token_uri` of a service account's key file: RFC 7523's JWT bearer grant, signed RS256 by the
account's key, checked against `--public-key`); none or another: 401 UNAUTHENTICATED. Errors: `{"error":
{"code", "message", "status"}}`.

`POST /v1/projects/{p}/locations/{l}/batchPredictionJobs` needs `displayName`, `model`
(`publishers/google/models/gemini-*`, or the full `projects/{p}/locations/{l}/publishers/...`), `inputConfig`
(`instancesFormat: jsonl`, `gcsSource.uris`: gs:// URIs) and `outputConfig` (`predictionsFormat: jsonl`,
`gcsDestination.outputUriPrefix`: a gs:// prefix); it answers the `BatchPredictionJob` (`JOB_STATE_PENDING`).
`GET .../batchPredictionJobs/{id}`; `GET .../batchPredictionJobs?filter=display_name="x"`; `POST
.../{id}:cancel` (`JOB_STATE_CANCELLING`, then `JOB_STATE_CANCELLED`).

A job reads its input from GCS: each row `{"request": GenerateContentRequest}` (Vertex's fields: `contents` with
roles user/model, `systemInstruction`, `generationConfig` by its field names, `labels` as GCP labels: lower-case
keys and values of at most 63 characters). After `--batch-delay` seconds it writes `<prefix>/prediction-model-
<time>/predictions.jsonl`: one `{"status", "processed_time", "request", "response"}` row per input row, in
reverse input order (Vertex promises none); a row it could not run has no `response` and its error text in
`status` (`Bad Request: {"error": {...}}`). `outputInfo.gcsOutputDirectory` names the directory; the job ends
`JOB_STATE_SUCCEEDED`. An unreadable input or an invalid row fails the whole job (`JOB_STATE_FAILED`, `error`: a
`google.rpc.Status`), as Vertex's validation does. Directives: `#fail:CODE` errors that row with HTTP status
CODE; `#batch:expire` / `#batch:fail` end the job `JOB_STATE_EXPIRED` / `JOB_STATE_FAILED`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import secrets
import urllib.parse
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.stub_process import bill, directive, serve, stub_arguments
from tests.fakes.stubs_gemini import _CONTENT_FIELDS, _GENERATION_FIELDS, _PART_FIELDS, _REQUEST_FIELDS, _answer

_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
           429: "RESOURCE_EXHAUSTED", 500: "INTERNAL"}
_GOOGLE_TOKEN_URI = "https://oauth2.googleapis.com/token"
_ENDED = ("JOB_STATE_SUCCEEDED", "JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED")
_LABEL = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")
_MODEL = re.compile(r"^(projects/[^/]+/locations/[^/]+/)?publishers/google/models/(gemini-[\w.-]+)$")


class ApiError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _gs(uri: Any) -> tuple[str, str]:
    if not isinstance(uri, str) or not uri.startswith("gs://") or "/" not in uri.removeprefix("gs://"):
        raise ApiError(400, f"{uri!r} is not a gs:// URI of an object or prefix")
    bucket, _, key = uri.removeprefix("gs://").partition("/")
    return bucket, key


class VertexStub:
    def __init__(self, batch_delay: float, gcs: str, public_key: Any = None) -> None:
        self.batch_delay, self.gcs, self.public_key = batch_delay, gcs.rstrip("/"), public_key
        self.tokens: set[str] = set()
        self.jobs: dict[str, dict[str, Any]] = {}  # job id -> the BatchPredictionJob
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.counters: Counter[str] = Counter()
        self.inputs_seen: list[dict[str, Any]] = []

    async def token(self, request: Request) -> Response:
        """OAuth 2.0's token endpoint for a service account (RFC 7523): a JWT signed RS256 by the account's key,
        `aud` Google's token URI, `iss` the account, `scope` given; with `--public-key`, its signature is checked."""
        form = urllib.parse.parse_qs((await request.body()).decode())
        if form.get("grant_type") != ["urn:ietf:params:oauth:grant-type:jwt-bearer"] or not form.get("assertion"):
            return JSONResponse({"error": "unsupported_grant_type"}, status_code=400)
        problem = self._invalid_assertion(form["assertion"][0], str(request.url))
        if problem:
            return JSONResponse({"error": "invalid_grant", "error_description": problem}, status_code=400)
        token = "ya29.stand-in-" + secrets.token_hex(8)
        self.tokens.add(token)
        self.counters["tokens"] += 1
        return JSONResponse({"access_token": token, "expires_in": 3599, "token_type": "Bearer"})

    def _invalid_assertion(self, assertion: str, url: str) -> str | None:
        try:
            head, claims, signature = (base64.urlsafe_b64decode(p + "=" * (-len(p) % 4))
                                       for p in assertion.split("."))
            header, body = json.loads(head), json.loads(claims)
        except ValueError:
            return "the assertion is not a JWT"
        # Google's JWT flow: `aud` is Google's token URI (google-auth writes it whatever the key file's token_uri)
        if header.get("alg") != "RS256" or not body.get("iss") or not body.get("scope") \
                or body.get("aud") not in (_GOOGLE_TOKEN_URI, url):
            return f"the JWT needs alg RS256, iss, scope and aud {_GOOGLE_TOKEN_URI} (claims: {sorted(body)})"
        if self.public_key is not None:
            from cryptography.exceptions import InvalidSignature
            from cryptography.hazmat.primitives import hashes
            from cryptography.hazmat.primitives.asymmetric import padding

            signed = assertion.rsplit(".", 1)[0].encode()
            try:
                self.public_key.verify(signature, signed, padding.PKCS1v15(), hashes.SHA256())
            except InvalidSignature:
                return "Invalid JWT Signature."
        return None

    async def dispatch(self, request: Request) -> Response:
        try:
            if request.headers.get("authorization", "").removeprefix("Bearer ") not in self.tokens:
                raise ApiError(401, "Request had invalid authentication credentials. Expected OAuth 2 access token.")
            path, method = request.url.path.removeprefix("/v1/"), request.method
            match = re.fullmatch(r"projects/([^/]+)/locations/([^/]+)/batchPredictionJobs(?:/([^/:]+))?(:cancel)?",
                                 path)
            if match is None:
                raise ApiError(404, f"{method} {request.url.path} is not a method of this API")
            project, location, job_id, cancel = match.groups()
            if job_id is None and method == "POST":
                return await self.create(project, location, json.loads(await request.body()))
            if job_id is None and method == "GET":
                return self.listing(project, location, request.query_params.get("filter", ""))
            job = self.jobs.get(job_id or "")
            if job is None or not job["name"].startswith(f"projects/{project}/locations/{location}/"):
                raise ApiError(404, f"BatchPredictionJob {path} does not exist.")
            if cancel and method == "POST":
                return self.cancel(job)
            if not cancel and method == "GET":
                return JSONResponse(job)
            raise ApiError(404, f"{method} {request.url.path} is not a method of this API")
        except ApiError as exc:
            return JSONResponse({"error": {"code": exc.code, "message": exc.message,
                                           "status": _STATUS.get(exc.code, "UNKNOWN")}}, status_code=exc.code)

    async def create(self, project: str, location: str, body: dict[str, Any]) -> Response:
        for name in ("displayName", "model", "inputConfig", "outputConfig"):
            if not body.get(name):
                raise ApiError(400, f"batch_prediction_job.{name} is required.")
        if not _MODEL.match(str(body["model"])):
            raise ApiError(400, f"batch_prediction_job.model {body['model']!r}: a publishers/google/models/gemini-* "
                                "model is required.")
        source, output = body["inputConfig"], body["outputConfig"]
        if source.get("instancesFormat") != "jsonl" or not isinstance((source.get("gcsSource") or {}).get("uris"),
                                                                      list):
            raise ApiError(400, "inputConfig: instancesFormat jsonl and gcsSource.uris are required.")
        if output.get("predictionsFormat") != "jsonl":
            raise ApiError(400, "outputConfig.predictionsFormat: jsonl is required for Gemini batch prediction.")
        uris = source["gcsSource"]["uris"]
        for uri in uris:
            _gs(uri)
        _gs((output.get("gcsDestination") or {}).get("outputUriPrefix"))
        job_id = str(secrets.randbelow(10**18))
        job = {"name": f"projects/{project}/locations/{location}/batchPredictionJobs/{job_id}",
               "displayName": body["displayName"], "model": body["model"], "inputConfig": source,
               "outputConfig": output, "state": "JOB_STATE_PENDING", "createTime": _now(), "updateTime": _now()}
        self.jobs[job_id] = job
        self.counters["batches_created"] += 1
        self.tasks[job_id] = asyncio.get_running_loop().create_task(self._run(job, uris))
        return JSONResponse(job)

    def listing(self, project: str, location: str, filter_: str) -> Response:
        wanted = re.fullmatch(r'display_name="([^"]*)"', filter_.strip())
        if filter_ and wanted is None:
            raise ApiError(400, f"Unsupported filter {filter_!r} (this stand-in takes display_name=\"...\")")
        mine = [j for j in self.jobs.values() if j["name"].startswith(f"projects/{project}/locations/{location}/")
                and (wanted is None or j["displayName"] == wanted.group(1))]
        return JSONResponse({"batchPredictionJobs": mine})

    def cancel(self, job: dict[str, Any]) -> Response:
        if job["state"] in _ENDED:
            raise ApiError(400, f"BatchPredictionJob {job['name']} is in state {job['state']}: it cannot be "
                                "cancelled.")
        self.counters["cancels"] += 1
        self.tasks[job["name"].rsplit("/", 1)[-1]].cancel()
        job.update(state="JOB_STATE_CANCELLED", endTime=_now(), updateTime=_now(),
                   error={"code": 1, "message": "CANCELED"})
        return JSONResponse({})

    def _end(self, job: dict[str, Any], state: str, message: str | None = None, code: int = 13) -> None:
        job.update(state=state, endTime=_now(), updateTime=_now())
        if message is not None:
            job["error"] = {"code": code, "message": message}

    async def _run(self, job: dict[str, Any], uris: list[str]) -> None:
        job["state"] = "JOB_STATE_RUNNING"
        rows: list[dict[str, Any]] = []
        async with httpx.AsyncClient(timeout=30) as client:
            for uri in uris:
                bucket, key = _gs(uri)
                reply = await client.get(f"{self.gcs}/storage/v1/b/{bucket}/o/"
                                         f"{urllib.parse.quote(key, safe='')}?alt=media")
                if reply.status_code != 200:
                    self._end(job, "JOB_STATE_FAILED", f"Failed to read the input {uri}: {reply.status_code}", 5)
                    return
                for i, raw in enumerate(reply.content.splitlines()):
                    if not raw.strip():
                        continue
                    try:
                        row = json.loads(raw)
                        _validate(row)
                    except (ValueError, ApiError) as exc:
                        self._end(job, "JOB_STATE_FAILED", f"Invalid input row {i + 1} of {uri}: {exc}", 3)
                        return
                    rows.append(row)
            self.inputs_seen.extend(r["request"] for r in rows)
            self.counters["batch_requests"] += len(rows)
            await asyncio.sleep(self.batch_delay)
            text = json.dumps(rows)
            if "#batch:expire" in text or "#batch:fail" in text:
                expired = "#batch:expire" in text
                self._end(job, "JOB_STATE_EXPIRED" if expired else "JOB_STATE_FAILED",
                          "The batch prediction job expired." if expired else "Internal error (#batch:fail).",
                          4 if expired else 13)
                return
            model = _MODEL.match(job["model"]).group(2)  # type: ignore[union-attr]
            answered = [_row(r["request"], model) for r in reversed(rows)]
            for row in answered:
                bill(self.counters, (row.get("response") or {}).get("usageMetadata"))
            out = [json.dumps(row) for row in answered]
            bucket, prefix = _gs(job["outputConfig"]["gcsDestination"]["outputUriPrefix"])
            directory = f"{prefix.rstrip('/')}/prediction-model-{datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%S.%fZ')}"
            put = await client.post(f"{self.gcs}/upload/storage/v1/b/{bucket}/o", params={
                "uploadType": "media", "name": f"{directory}/predictions.jsonl"},
                content=("\n".join(out) + "\n").encode(), headers={"content-type": "application/octet-stream"})
            if put.status_code >= 300:
                self._end(job, "JOB_STATE_FAILED", f"Failed to write the output: {put.status_code}", 13)
                return
        failed = sum('"response"' not in line for line in out)
        job["outputInfo"] = {"gcsOutputDirectory": f"gs://{bucket}/{directory}"}
        job["completionStats"] = {"successfulCount": str(len(out) - failed), "failedCount": str(failed)}
        self._end(job, "JOB_STATE_SUCCEEDED")

    def stats(self) -> dict[str, Any]:
        return {**self.counters, "inputs_seen": self.inputs_seen}


def _validate(row: Any) -> None:
    if not isinstance(row, dict) or not isinstance(row.get("request"), dict) or set(row) != {"request"}:
        raise ApiError(400, 'a row is {"request": GenerateContentRequest}')
    request = row["request"]
    stray = set(request) - _REQUEST_FIELDS - {"labels"}
    generation = request.get("generationConfig", request.get("generation_config")) or {}
    stray |= set(generation) - _GENERATION_FIELDS
    if stray:
        raise ApiError(400, f"Invalid JSON payload received. Unknown name {sorted(stray)[0]!r}: Cannot find field.")
    contents = request.get("contents")
    if not isinstance(contents, list) or not contents:
        raise ApiError(400, "contents is not specified")
    system = request.get("systemInstruction", request.get("system_instruction"))
    for content in contents + ([system] if system is not None else []):
        if not isinstance(content, dict) or set(content) - _CONTENT_FIELDS or not isinstance(content.get("parts"),
                                                                                              list):
            raise ApiError(400, "a Content is {parts, role}")
        if content is not system and content.get("role") not in ("user", "model"):
            raise ApiError(400, "Please use a valid role: user, model.")
        if any(not isinstance(p, dict) or set(p) - _PART_FIELDS for p in content["parts"]):
            raise ApiError(400, "Unknown name in a Part")
    labels = request.get("labels") or {}
    if not isinstance(labels, dict) or any(not _LABEL.match(str(k)) or not isinstance(v, str)
                                           or not _LABEL_VALUE.match(v) for k, v in labels.items()):
        raise ApiError(400, "labels: keys and values are lower-case letters, digits, _ and -, at most 63 characters")


def _row(request: dict[str, Any], model: str) -> dict[str, Any]:
    row: dict[str, Any] = {"status": "", "processed_time": _now(), "request": request}
    text = " ".join(str(p.get("text", "")) for p in request["contents"][-1].get("parts") or [])
    failure = directive(text, "fail")
    if failure is not None:
        code = int(failure or 500)
        row["status"] = ("Bad Request: " if code == 400 else "") + json.dumps(
            {"error": {"code": code, "message": f"Row failed (#fail:{failure}).", "status": _STATUS.get(code, "")}})
    else:
        row["response"] = _answer(request, model)["response"]
    return row


def build_app(stub: VertexStub) -> Starlette:
    async def stats(request: Request) -> Response:
        return JSONResponse(stub.stats())

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    return Starlette(routes=[
        Route("/_health", health), Route("/_stats", stats), Route("/token", stub.token, methods=["POST"]),
        Route("/v1/{rest:path}", stub.dispatch, methods=["GET", "POST"]),
    ])


def main() -> None:
    parser = stub_arguments("python -m tests.fakes.stubs_vertex", "Vertex AI batch prediction stand-in.")
    parser.add_argument("--gcs-endpoint", required=True, help="the Cloud Storage emulator jobs read and write")
    parser.add_argument("--public-key", default=None, help="a PEM file: the service account's key, to check JWTs")
    args = parser.parse_args()
    key = None
    if args.public_key:
        from cryptography.hazmat.primitives.serialization import load_pem_public_key

        with open(args.public_key, "rb") as pem:
            key = load_pem_public_key(pem.read())
    serve(build_app(VertexStub(args.batch_delay, args.gcs_endpoint, key)), args)


if __name__ == "__main__":
    main()
