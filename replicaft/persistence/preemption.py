"""Preemption notices: leave when the cloud announces a preemption, before its SIGTERM.

Spot and preemptible machines are announced before they are taken: AWS publishes
``latest/meta-data/spot/instance-action`` two minutes ahead, GCE turns
``computeMetadata/v1/instance/preempted`` to ``TRUE``, and a node agent can drop a file. A
SIGTERM may come later than that, or never reach a process inside a container, so a watcher
polls the source and, on a notice, raises the same flag the SIGTERM handler raises
(:meth:`replicaft.persistence.duties.Persistence.preempt`, with the source as the reason). It does
nothing else: the flag travels in the rank's vote and every rank of the group leaves at the
same step boundary, the writer group saving first (replicaft/persistence/duties.py). One way to leave; a
notice only starts it earlier. The process exits as after SIGTERM (status 143), so an
orchestrator reads "preempted", not "finished" (0 would end a Kubernetes Job or a
torchrun restart policy as if training were done).

The rule that reads an answer (:func:`read_answer`: kind, status, body to a :class:`Reading`)
is pure and tested by table; :class:`PreemptionWatcher` is the shell around it: one daemon
thread, started and stopped by its owner, every wait bounded (the poll interval; each request
by a quarter of it, within 0.5-2 s). A source that cannot be reached or answers nonsense is
logged once per outage (an event and a warning) and retried; a watcher never raises into
training.

Rejected: ``?wait_for_change=true`` (GCE's long poll) would hold a request open for minutes,
a wait without our deadline, and AWS has no equivalent; a 5 s poll of a link-local service
costs nothing measurable.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from replicaft.checkpoint.entries import open_regular
from replicaft.errors import CheckpointCorrupt, OptionsError

logger = logging.getLogger(__name__)

NoticeKind = Literal["gce", "aws", "http", "file"]
KINDS = ("auto", "gce", "aws", "http", "file")
_URL_KINDS: dict[str, NoticeKind] = {"gce": "gce", "aws": "aws", "http": "http"}

GCE_URL = "http://169.254.169.254/computeMetadata/v1/instance/preempted"
"""The metadata server by address, as GCE documents it beside ``metadata.google.internal``: a
name lookup is a wait that the request's timeout does not bound."""
AWS_URL = "http://169.254.169.254/latest/meta-data/spot/instance-action"
SHORTCUTS = {"gce": GCE_URL, "aws": AWS_URL}
"""``preemption_notice=gce`` / ``aws``: the provider's metadata URL."""
AWS_TOKEN_TTL_S = 21600
"""IMDSv2 session tokens live at most six hours; ours is renewed at half of that."""
MAX_BODY_BYTES = 4096
NOTICE_FILE_RULE = "a notice file is a regular file that its writer creates or fills"
MIN_REQUEST_TIMEOUT_S = 0.5
"""Even with a short poll: on a loaded 2-core test host a loopback answer took over 5 ms."""
MAX_REQUEST_TIMEOUT_S = 2.0
"""A metadata service answers in milliseconds; a request still waiting after this is lost."""


@dataclass(frozen=True, slots=True)
class NoticeSource:
    kind: NoticeKind
    location: str
    """The URL, or the file's path for ``file``."""

    def __str__(self) -> str:
        return f"{self.kind} {self.location}"


def parse_notice_source(notice: str | None, kind: str = "auto") -> NoticeSource | None:
    """The source ``preemption_notice`` names (None/empty: none); OptionsError naming the fix.

    ``notice`` is ``gce``, ``aws``, an ``http(s)://`` URL or ``file:PATH``. With ``kind="auto"``
    a file is ``file``, and a URL is ``gce`` or ``aws`` when its path is that provider's, else
    ``http`` (an answer 200 is the notice).
    """
    if kind not in KINDS:
        raise OptionsError(f"preemption_notice_kind={kind!r}; use one of {', '.join(KINDS)}")
    if not notice:
        return None
    notice = SHORTCUTS.get(notice, notice)
    if notice.startswith("file:"):
        path = notice.removeprefix("file:").removeprefix("//")
        if not Path(path).is_absolute() or kind not in ("auto", "file"):
            raise OptionsError(
                f"preemption_notice={notice!r} with preemption_notice_kind={kind!r}: a file source "
                "is file:/absolute/path and its kind 'file' (or 'auto')"
            )
        return NoticeSource("file", path)
    url = urllib.parse.urlsplit(notice)
    if url.scheme not in ("http", "https") or not url.netloc:
        raise OptionsError(
            f"preemption_notice={notice!r} is not a source; use 'gce', 'aws', an http(s):// URL of "
            "the metadata service, or file:/path/of/a/notice/file"
        )
    if kind == "file":
        raise OptionsError(
            f"preemption_notice={notice!r} is a URL but preemption_notice_kind='file'; "
            "use file:/path, or a kind among gce, aws, http, auto"
        )
    if kind != "auto":
        return NoticeSource(_URL_KINDS[kind], notice)
    if url.path.endswith("/instance/preempted"):
        return NoticeSource("gce", notice)
    return NoticeSource("aws" if url.path.endswith("/spot/instance-action") else "http", notice)


def check_notice_options(notice: str | None, kind: str) -> None:
    """ManagerOptions' preemption-notice source (OptionsError); the poll interval is one of its numbers."""
    parse_notice_source(notice, kind)


@dataclass(frozen=True, slots=True)
class Reading:
    """What one answer of a source says."""

    notice: bool
    reason: str
    understood: bool = True
    """False: not an answer this kind of source gives (wrong URL, missing header, server
    trouble); logged like a network error, and no notice."""


def read_answer(kind: NoticeKind, status: int, body: str) -> Reading:
    """Whether an answer announces a preemption. A file source answers 200 with its content
    when it exists and 404 when not, as a static web server would."""
    text = body.strip()
    if kind == "gce":
        if status != 200:
            return Reading(False, f"HTTP {status} (outside GCE, or no Metadata-Flavor header?)", understood=False)
        if text.upper() in ("TRUE", "FALSE"):
            return Reading(text.upper() == "TRUE", f"instance/preempted is {text.upper()}")
        return Reading(False, f"instance/preempted is {text[:80]!r}, neither TRUE nor FALSE", understood=False)
    if kind == "aws":
        if status == 404:
            return Reading(False, "no spot instance-action")
        if status != 200:
            return Reading(False, f"HTTP {status} (outside EC2, or an IMDSv2 token refused?)", understood=False)
        return Reading(True, f"spot instance-action {_aws_action(text)}")
    if kind == "file":
        if status == 404:
            return Reading(False, "no notice file")
        if text.lower() in ("false", "0", "no"):
            return Reading(False, f"the notice file says {text!r}")
        return Reading(True, f"the notice file exists{f' ({text[:80]!r})' if text else ''}")
    if status == 200:
        return Reading(True, f"HTTP 200{f' ({text[:80]!r})' if text else ''}")
    if status >= 500:
        return Reading(False, f"HTTP {status} (server error)", understood=False)
    return Reading(False, f"HTTP {status}")


def _aws_action(text: str) -> str:
    """``terminate at 2026-11-27T15:02:00Z`` from the JSON AWS gives; the text itself otherwise
    (a 200 is a notice whatever it says: it exists only once the instance is marked)."""
    try:
        doc = json.loads(text)
        return f"{doc['action']} at {doc['time']}"
    except (ValueError, KeyError, TypeError):
        return repr(text[:80])


class PreemptionWatcher:
    """Polls ``source`` every ``poll_s`` on a daemon thread; on the first notice, calls
    ``on_notice(reason)`` once, emits ``preemption_notice`` and stops polling.

    The owner calls :meth:`start` and :meth:`stop`. ``emit(event, **fields)`` is the rank's
    event sink; ``context`` prefixes log lines (``replica_id/group_rank``).
    """

    def __init__(
        self,
        source: NoticeSource,
        poll_s: float,
        on_notice: Callable[[str], None],
        emit: Callable[..., None],
        context: str,
    ) -> None:
        self.source = source
        self.poll_s = poll_s
        self.timeout_s = min(max(poll_s / 4, MIN_REQUEST_TIMEOUT_S), MAX_REQUEST_TIMEOUT_S)
        self._on_notice = on_notice
        self._emit = emit
        self._context = context
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # A metadata service is link-local: never ask an HTTP(S)_PROXY from the environment.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._aws_token: tuple[str, float] | None = None
        """IMDSv2 session token and when (monotonic) it expires; None: none (yet, or IMDSv1)."""

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="replicaft-preemption-watcher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop polling and join the thread; a request in flight ends within its own timeout."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def poll_once(self) -> Reading:
        """Ask the source once (blocks at most twice ``timeout_s``); raises OSError (or
        ``http.client.HTTPException``, a garbled answer) when it cannot be reached."""
        status, body = self._fetch()
        reading = read_answer(self.source.kind, status, body)
        if self.source.kind == "aws" and status == 401:
            self._aws_token = None  # expired or revoked: the next poll asks for a new one
        return reading

    def _run(self) -> None:
        trouble: str | None = None
        while not self._stop.is_set():
            try:
                reading = self.poll_once()
                problem = None if reading.understood else reading.reason
            except Exception as e:  # a watcher must never end training: logged once, retried
                reading, problem = None, f"{type(e).__name__}: {e}"
            if problem is not None and trouble is None:
                logger.warning(
                    "[%s] preemption notices from %s cannot be read: %s; retrying every %gs",
                    self._context,
                    self.source,
                    problem,
                    self.poll_s,
                )
                self._emit("preemption_source_error", source=self.source.location, kind=self.source.kind, error=problem)
            elif problem is None and trouble is not None:
                logger.info("[%s] preemption notices from %s readable again", self._context, self.source)
            trouble = problem
            if reading is not None and reading.notice:
                self._announce(reading)
                return
            self._stop.wait(self.poll_s)

    def _announce(self, reading: Reading) -> None:
        logger.warning(
            "[%s] preemption notice from %s: %s; leaving at the next step boundary",
            self._context,
            self.source,
            reading.reason,
        )
        self._emit("preemption_notice", source=self.source.location, kind=self.source.kind, reason=reading.reason)
        self._on_notice(f"notice from {self.source}: {reading.reason}")

    def _fetch(self) -> tuple[int, str]:
        if self.source.kind == "file":
            path = Path(self.source.location)
            if not path.exists():
                return 404, ""
            # Never a plain open: a FIFO there would block this thread (and its stop) forever.
            try:
                with open_regular(
                    path, f"the preemption notice file {path}", follow_links=True, rule=NOTICE_FILE_RULE
                ) as f:
                    return 200, f.read(MAX_BODY_BYTES).decode("utf-8", errors="replace")
            except CheckpointCorrupt as e:  # the helper's word for "not a regular file": not a checkpoint here
                raise OSError(str(e)) from None
        headers = {"Metadata-Flavor": "Google"} if self.source.kind == "gce" else {}
        if self.source.kind == "aws" and (token := self._token()) is not None:
            headers["X-aws-ec2-metadata-token"] = token
        return self._request(urllib.request.Request(self.source.location, headers=headers))

    def _token(self) -> str | None:
        """The IMDSv2 session token (PUT /latest/api/token), renewed at half its life; None
        when the service does not issue one (IMDSv1 only): then the notice is asked for without."""
        now = time.monotonic()
        if self._aws_token is not None and now < self._aws_token[1]:
            return self._aws_token[0]
        url = urllib.parse.urlsplit(self.source.location)._replace(path="/latest/api/token", query="").geturl()
        status, body = self._request(
            urllib.request.Request(
                url, method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": str(AWS_TOKEN_TTL_S)}
            )
        )
        self._aws_token = (body.strip(), now + AWS_TOKEN_TTL_S / 2) if status == 200 and body.strip() else None
        return self._aws_token[0] if self._aws_token else None

    def _request(self, request: urllib.request.Request) -> tuple[int, str]:
        try:
            with self._opener.open(request, timeout=self.timeout_s) as response:
                return response.status, _text(response)
        except urllib.error.HTTPError as e:  # an answer, only not a 2xx one
            with e:
                return e.code, _text(e)


def _text(response: Any) -> str:
    body: bytes = response.read(MAX_BODY_BYTES)
    return body.decode("utf-8", errors="replace")


class PreemptionFlag:
    """Raised once, by the SIGTERM handler or a preemption notice's thread; read by the step.

    Raising it takes no lock. A ``threading.Event`` did (its ``set()`` holds a lock), and a
    second SIGTERM delivered while the first one's handler was inside ``set()`` (the sender's
    and torchrun's forwarded one arrive together) ran the handler again on the same thread,
    which then waited for that lock forever: in chaos ``every_fault_w2`` one rank of a group
    never left, and py-spy showed ``_on_sigterm`` inside ``_on_sigterm``, both in ``Event.set``.
    """

    __slots__ = ("_raised",)

    def __init__(self) -> None:
        self._raised = False

    def set(self) -> None:
        self._raised = True

    def is_set(self) -> bool:
        return self._raised
