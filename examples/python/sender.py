#!/usr/bin/env python3
"""A sender for quota-worker: consume a dispatch queue, call the provider, and tell
the worker what happened (docs/guide/feedback.md).

    python3 sender.py --channel sms [--provider http://...] [--idle 5]

Each dispatched job is sent to the provider with an HTTP POST. Its answer becomes a
feedback, published with confirms to the feedback exchange:

    2xx          -> delivered
    410          -> bounced (the address is gone)
    429          -> throttled, with the provider's Retry-After; the job is held for
                    that long and sent again (the worker pauses the channel for every
                    worker meanwhile)
    5xx, errors  -> failed (the worker gives the send back; this sender does not
                    republish: a real one may)

The dispatch is acked only once its feedback is confirmed, so a sender that dies
leaves the job in the queue. Without --provider, a fake provider runs in this process:
it answers by the recipient's first word: "fail..." 503, "bounce..." 410, "slow..."
429 (Retry-After: 1) the first time and 200 after, anything else 200.

Configured like the worker: QUOTA_WORKER__AMQP__URL, QUOTA_WORKER__AMQP__DISPATCH_QUEUE_PREFIX,
QUOTA_WORKER__FEEDBACK__EXCHANGE. Prints one line per feedback: the job id and the event.

Tracing (docs/guide/tracing.md): each feedback carries the trace context of its
dispatch, so the worker's feedback span closes the job's trace. With the
opentelemetry-api package installed (and an SDK configured), the provider call is a
span of its own, child of the dispatch, and the feedback carries that span's context;
without it, the dispatch's traceparent/tracestate headers are passed on as they are.
"""

import argparse
import http.server
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request

import pika

try:  # optional: tracing
    from opentelemetry import propagate, trace
except ImportError:
    propagate = trace = None

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2f"
TRACE_HEADERS = ("traceparent", "tracestate")


def carried(properties):
    """The trace context headers of a delivery (str values), if any."""
    return {
        k: (v.decode() if isinstance(v, bytes) else str(v))
        for k, v in (properties.headers or {}).items()
        if k in TRACE_HEADERS
    }


def traced(name, headers):
    """A span continuing the context `headers` carry (a no-op without opentelemetry)."""
    if trace is None:
        import contextlib

        return contextlib.nullcontext()
    parent = propagate.extract(headers)
    return trace.get_tracer("quota-worker-sender").start_as_current_span(
        name, context=parent, kind=trace.SpanKind.CLIENT
    )


def feedback_headers(dispatch_headers):
    """The feedback's trace headers: the current span's, or the dispatch's as they are."""
    if propagate is not None:
        headers = {}
        propagate.inject(headers)
        if headers:
            return headers
    return dispatch_headers or None


class FakeProvider(http.server.BaseHTTPRequestHandler):
    """Answers 200, 503, 429 or 410 by the recipient, as the module docs say."""

    throttled = set()
    lock = threading.Lock()

    def do_POST(self):
        job = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        recipient = str(job.get("recipient", ""))
        headers = {}
        if recipient.startswith("fail"):
            status = 503
        elif recipient.startswith("bounce"):
            status = 410
        elif recipient.startswith("slow"):
            with self.lock:
                first = recipient not in self.throttled
                self.throttled.add(recipient)
            status, headers = (429, {"Retry-After": "1"}) if first else (200, {})
        else:
            status = 200
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def start_fake_provider():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeProvider)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/send"


def call(provider, body):
    """(event, retry_after seconds or None, detail) for one send."""
    request = urllib.request.Request(provider, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return "delivered", None, f"provider {answer.status}"
    except urllib.error.HTTPError as err:
        if err.code == 429:
            retry = err.headers.get("Retry-After")
            return "throttled", float(retry) if retry else None, "provider 429"
        if err.code == 410:
            return "bounced", None, "provider 410"
        return "failed", None, f"provider {err.code}"
    except (urllib.error.URLError, OSError) as err:
        return "failed", None, f"provider unreachable: {err}"


def main():
    parser = argparse.ArgumentParser(description="Send dispatched jobs and publish feedback.")
    parser.add_argument("--channel", required=True, help="the channel whose dispatch queue to consume")
    parser.add_argument("--provider", help="the provider's URL (default: a fake one in this process)")
    parser.add_argument("--idle", type=float, default=0, help="exit after this many idle seconds (0: never)")
    args = parser.parse_args()

    url = os.environ.get("QUOTA_WORKER__AMQP__URL") or DEFAULT_URL
    prefix = os.environ.get("QUOTA_WORKER__AMQP__DISPATCH_QUEUE_PREFIX") or "notify.dispatch."
    exchange = os.environ.get("QUOTA_WORKER__FEEDBACK__EXCHANGE") or "notify.feedback"
    provider = args.provider or start_fake_provider()

    connection = pika.BlockingConnection(pika.URLParameters(url))
    consume = connection.channel()
    consume.basic_qos(prefetch_count=10)
    publish = connection.channel()
    publish.confirm_delivery()

    def feedback(job, event, retry_after, detail, trace_headers):
        body = {
            "id": job.get("id"),
            "event": event,
            "recipient": job.get("recipient"),
            "channel": job.get("channel"),
            "tenant": job.get("tenant"),
            "retry_after": retry_after,
            "detail": detail,
        }
        # confirmed, or an exception: then the dispatch is not acked and comes back
        publish.basic_publish(
            exchange=exchange,
            routing_key="",
            body=json.dumps(body, separators=(",", ":")).encode("utf-8"),
            properties=pika.BasicProperties(
                content_type="application/json",
                delivery_mode=2,
                message_id=str(job.get("id")),
                headers=feedback_headers(trace_headers),
            ),
        )
        print(job.get("id"), event, flush=True)

    queue = prefix + args.channel
    idle_since = time.monotonic()
    for method, properties, body in consume.consume(queue, inactivity_timeout=0.5):
        if method is None:
            if args.idle and time.monotonic() - idle_since > args.idle:
                break
            continue
        idle_since = time.monotonic()
        job = json.loads(body)
        dispatch = carried(properties)
        while True:
            with traced(f"send {args.channel}", dispatch):
                event, retry_after, detail = call(provider, body)
                feedback(job, event, retry_after, detail, dispatch)
            if event != "throttled":
                break
            # hold the job for the provider's Retry-After, then send it again
            connection.sleep(retry_after if retry_after is not None else 1.0)
        consume.basic_ack(method.delivery_tag)
    consume.cancel()
    connection.close()


if __name__ == "__main__":
    sys.exit(main())
