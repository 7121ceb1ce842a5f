"""The Gemini API's Batch Mode (`UpstreamJobs`): chat lines as `GenerateContentRequest`s, inline or in a file.

A Gemini batch runs one model, named in its URL: `POST v1beta/models/{model}:batchGenerateContent` with
`{"batch": {"displayName", "inputConfig": ...}}` makes a long-running operation `batches/{id}`, polled with
`GET v1beta/batches/{id}` (its `metadata.state` is `BATCH_STATE_*`) and cancelled with
`POST v1beta/batches/{id}:cancel`. The requests go one of two ways (Google's Batch Mode guide):
- inline, `inputConfig.requests.requests: [{request, metadata: {key}}]`, for a body up to 20 MB; the done
  operation's `response.inlinedResponses.inlinedResponses` holds one `{response | error, metadata}` each;
- as a JSONL file of `{key, request}` lines uploaded through the Files API (`upload/v1beta/files`, resumable:
  a start call, then one `upload, finalize` call), named by `inputConfig.fileName`; the done operation's
  `response.responsesFile` names a JSONL file of `{key, response | error}` lines, downloaded from
  `download/v1beta/{file}:download?alt=media`.
A part whose inline body would pass `native_inline_max_bytes` (default and at most Google's 20 MB) goes as a
file, any other inline. Auth: the `x-goog-api-key` header.

What is LiteLLM's: each line's and each response's translation (`providers.native.gemini_content`), the auth header
and API base (`GeminiModelInfo`) and the state words (`litellm.llms.gemini.batches.transformation._STATUS_MAP`).
What is ours, over HTTP: the upload, create, poll, read back, cancel and the files' deletes. LiteLLM 1.110.2's
Gemini batch calls take an uploaded file of OpenAI-shaped rows only (translated by its own route), and its batch
object keeps no inline responses.

Limits (Google's docs): 20 MB of inline requests per batch, 2 GB per input file; a batch ends within 48 hours,
else `BATCH_STATE_EXPIRED`; uploaded files are deleted by Google after 48 hours (we delete ours, and the
responses file, once the results are read unless `native_keep_files`). A request's error is a
`google.rpc.Status`: its status word is the line's code.
"""

from __future__ import annotations

import json
import logging
import urllib.parse
from collections.abc import AsyncIterator
from typing import Any

from gateway.config.entries import NativeModelInfo
from gateway.domain import BatchRequest, Endpoint
from gateway.log_safe import escaped
from providers.native.contract import JobState, Save, UpstreamHTTPError, http_json, http_lines, provider_client
from providers.native.gemini_content import GeminiContent
from providers.native.openai_format import Part, call_with_retries, upstream_custom_id
from providers.upstream_errors import describe_error, error_message

log = logging.getLogger("batchyard.native")

INLINE_MAX_BYTES = 20_000_000  # Google's bound on a batchGenerateContent body of inline requests
_LIST_PAGES = 10  # batches listed (100 a page, newest first) to find one made before a crash recorded it
# google.rpc.Code: the HTTP status Google's REST mapping gives each (google/rpc/code.proto).
_RPC_CODES = {1: (499, "CANCELLED"), 2: (500, "UNKNOWN"), 3: (400, "INVALID_ARGUMENT"), 4: (504, "DEADLINE_EXCEEDED"),
              5: (404, "NOT_FOUND"), 7: (403, "PERMISSION_DENIED"), 8: (429, "RESOURCE_EXHAUSTED"),
              9: (400, "FAILED_PRECONDITION"), 13: (500, "INTERNAL"), 14: (503, "UNAVAILABLE"),
              16: (401, "UNAUTHENTICATED")}


class GeminiJobs(GeminiContent):
    """`gemini/` deployments: chat completions as Gemini Batch Mode jobs, inline or from an uploaded file."""

    providers = ("gemini",)
    endpoints = frozenset({Endpoint.CHAT})
    settings = frozenset({"native_inline_max_bytes", "native_keep_files"})

    def __init__(self, litellm: Any, provider: str, model: str, kwargs: dict[str, Any],
                 info: NativeModelInfo) -> None:
        from litellm.llms.gemini.chat.transformation import GoogleAIStudioGeminiConfig

        model = model.removeprefix("models/")
        super().__init__(GoogleAIStudioGeminiConfig(), model, "gemini", "Gemini")
        self.provider = provider
        self._litellm = litellm
        self._kwargs = kwargs
        bound = info.native_inline_max_bytes
        self._inline_max = INLINE_MAX_BYTES if bound is None else bound
        self._keep = info.native_keep_files

    # -- lines --------------------------------------------------------------------------------------

    def _translate(self, req: BatchRequest) -> bytes:
        """The file form, `{"key", "request"}` (`create` rewrites it for inline requests)."""
        entry = {"key": upstream_custom_id(req.line), "request": self._request(req.body)}
        return json.dumps(entry, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"

    # -- HTTP ---------------------------------------------------------------------------------------

    def _url(self, path: str) -> str:
        from litellm.litellm_core_utils.url_utils import join_api_base
        from litellm.llms.gemini.common_utils import GeminiModelInfo

        return str(join_api_base(GeminiModelInfo.get_api_base(self._kwargs.get("api_base")), path))

    def _headers(self) -> dict[str, str]:
        from litellm.llms.gemini.common_utils import GeminiModelInfo

        key = GeminiModelInfo.get_api_key(self._kwargs.get("api_key"))
        if not key:
            raise ValueError("a Gemini batch needs an api_key (litellm_params.api_key or GEMINI_API_KEY)")
        return {"x-goog-api-key": key, "content-type": "application/json"}

    def _batch_url(self, batch_id: str, verb: str = "") -> str:
        return self._url(f"v1beta/batches/{urllib.parse.quote(batch_id.removeprefix('batches/'), safe='')}{verb}")

    def _file_url(self, name: str, root: str = "v1beta", verb: str = "") -> str:
        return self._url(f"{root}/files/{urllib.parse.quote(name.removeprefix('files/'), safe='')}{verb}")

    async def _upload(self, data: bytes, name: str) -> str:
        """The part's JSONL as a Files API file (a resumable upload: start, then one `upload, finalize`)."""
        headers = {**self._headers(), "x-goog-upload-protocol": "resumable", "x-goog-upload-command": "start",
                   "x-goog-upload-header-content-length": str(len(data)),
                   "x-goog-upload-header-content-type": "application/jsonl"}
        async with provider_client(self._kwargs.get("timeout")) as client:
            start = await client.post(self._url("upload/v1beta/files"), headers=headers,
                                      content=json.dumps({"file": {"displayName": name}}).encode())
            session = start.headers.get("x-goog-upload-url")
            if start.status_code >= 400 or not session:
                raise UpstreamHTTPError(start.status_code if start.status_code >= 400 else 502,
                                        error_message(start) if start.status_code >= 400
                                        else "the upload start gave no x-goog-upload-url")
            done = await client.post(session, content=data, headers={
                "x-goog-api-key": headers["x-goog-api-key"], "x-goog-upload-offset": "0",
                "x-goog-upload-command": "upload, finalize"})
        if done.status_code >= 400:
            raise UpstreamHTTPError(done.status_code, error_message(done))
        return str(done.json()["file"]["name"])

    # -- the job ------------------------------------------------------------------------------------

    async def create(self, part: Part, data: bytes, name: str, metadata: dict[str, str], save: Save) -> None:
        display = name.removesuffix(".jsonl")
        head = b'{"batch":' + json.dumps({"displayName": display})[:-1].encode() + b',"inputConfig":'
        inline = None if part.file_id is not None else _inline(data)
        if inline is not None and len(head) + len(inline) + 40 <= self._inline_max:
            body = head + b'{"requests":{"requests":[' + inline + b"]}}}}"
        else:  # over the inline bound (or uploaded before a restart): the part goes as a file
            if part.file_id is None:
                part.file_id = await call_with_retries(lambda: self._upload(data, display))
                await save()
            body = head + json.dumps({"fileName": part.file_id}).encode() + b"}}"
        model = urllib.parse.quote(self._model, safe="")
        reply = await call_with_retries(lambda: http_json(
            "POST", self._url(f"v1beta/models/{model}:batchGenerateContent"), self._headers(),
            self._kwargs.get("timeout"), content=body))
        part.batch_id = str(reply["name"]).removeprefix("batches/")

    async def find(self, part: Part) -> bool:
        """A batch made from the part's uploaded file before a crash could record it: the newest batches, by
        their `inputConfig.fileName` (an inline part has no id until its batch exists)."""
        if part.file_id is None:
            return False
        token = ""
        for _ in range(_LIST_PAGES):
            params = {"pageSize": "100", **({"pageToken": token} if token else {})}
            reply = await http_json("GET", self._url("v1beta/batches"), self._headers(), self._kwargs.get("timeout"),
                                    params=params)
            for op in reply.get("operations") or []:
                config = (op.get("metadata") or {}).get("inputConfig") or {}
                if config.get("fileName") == part.file_id:
                    part.batch_id = str(op["name"]).removeprefix("batches/")
                    return True
            token = str(reply.get("nextPageToken") or "")
            if not token:
                break
        return False

    async def _operation(self, batch_id: str) -> dict[str, Any]:
        reply: dict[str, Any] = await http_json("GET", self._batch_url(batch_id), self._headers(),
                                                self._kwargs.get("timeout"))
        return reply

    async def retrieve(self, batch_id: str) -> JobState:
        from litellm.llms.gemini.batches.transformation import _STATUS_MAP

        operation = await self._operation(batch_id)
        state = str((operation.get("metadata") or {}).get("state") or "BATCH_STATE_UNSPECIFIED")
        status = str(_STATUS_MAP.get(state, "in_progress"))  # type: ignore[call-overload]
        error = operation.get("error") or {}
        return JobState(status=status, files=[batch_id], why=str(error.get("message") or ""))

    async def results(self, state: JobState) -> AsyncIterator[dict[str, Any]]:
        for batch_id in state.files:
            operation = await self._operation(batch_id)
            response = operation.get("response") or {}
            inlined = (response.get("inlinedResponses") or {}).get("inlinedResponses") or []
            for item in inlined:
                yield self._result(str((item.get("metadata") or {}).get("key")), item)
            responses = str(response.get("responsesFile") or "")
            if responses:
                url = self._file_url(responses, "download/v1beta", ":download") + "?alt=media"
                async for raw in http_lines(url, self._headers(), self._kwargs.get("timeout")):
                    item = json.loads(raw)
                    yield self._result(str(item.get("key")), item)
            uploaded = ((operation.get("metadata") or {}).get("inputConfig") or {}).get("fileName")
            if not self._keep:  # the input we uploaded and the responses file Google wrote leave with the batch
                await self._delete([f for f in (uploaded, responses) if f])

    async def _delete(self, files: list[str]) -> None:
        """Best effort: Google deletes a file 48 hours after its upload in any case."""
        for name in files:
            try:
                await http_json("DELETE", self._file_url(name), self._headers(), self._kwargs.get("timeout"))
            except UpstreamHTTPError as exc:
                if exc.status_code != 404:
                    log.warning("native: deleting Gemini file %s failed: %s %s", escaped(name), exc.status_code,
                                escaped(exc.message))
            except Exception as exc:  # the results are out already: a lost connection leaves the file to Google
                log.warning("native: deleting Gemini file %s failed: %s", escaped(name), escaped(describe_error(exc)))

    def _result(self, custom_id: str, item: dict[str, Any]) -> dict[str, Any]:
        """One request's outcome (`response`: a `GenerateContentResponse`; `error`: a `google.rpc.Status`) as an
        OpenAI batch output line."""
        if isinstance(item.get("response"), dict):
            return self._answer(custom_id, item["response"])
        error = item.get("error") or {}
        code = error.get("code")
        status, word = _RPC_CODES.get(code if isinstance(code, int) else 2, (500, "UNKNOWN"))
        body = {"error": {"message": str(error.get("message") or ""), "type": "invalid_request_error"
                          if status == 400 else "api_error", "param": None, "code": word}}
        return {"custom_id": custom_id, "response": {"status_code": status, "body": body}}

    async def cancel(self, batch_id: str) -> None:
        await http_json("POST", self._batch_url(batch_id, ":cancel"), self._headers(), self._kwargs.get("timeout"),
                        content=b"{}")


def _inline(data: bytes) -> bytes:
    """The part's file lines (`{"key":"l1","request":...}`) as inline requests (`{"metadata":{"key":"l1"},
    "request":...}`), comma-joined; the keys are ours (`l<line>`), so the rewrite is a byte splice."""
    out = []
    for line in data.splitlines():
        if line:
            comma = line.index(b",", 7)  # after `{"key":"l<line>"`
            out.append(b'{"metadata":{"key":' + line[7:comma] + b"}" + line[comma:])
    return b",".join(out)
