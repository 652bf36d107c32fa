#!/usr/bin/env python3
"""Publish one notification job to quota-worker and print its id.

    python3 publish.py --recipient +8613800000000 --channel sms \
        --timezone Asia/Shanghai --payload '{"text": "Your parcel is on its way"}'

The job is the JSON object described in the top-level README ("A job, end to end"). It is
published the way the worker expects: persistent, application/json, message_id =
the job id, mandatory, and confirmed by the broker. Exits non-zero when the broker
nacks the job or returns it as unroutable (no queue bound: the worker has not
declared its topology yet).

Tracing (docs/guide/tracing.md): with the opentelemetry-api package installed and a
span current, the job carries its W3C traceparent/tracestate headers, so the worker's
spans continue the caller's trace; without one, a TRACEPARENT variable is passed on as
the header.
"""

import argparse
import json
import os
import sys
import uuid

import pika
from pika.exceptions import AMQPError, UnroutableError

try:  # optional: tracing
    from opentelemetry import propagate
except ImportError:
    propagate = None

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2f"


def trace_headers():
    """The current trace context as AMQP headers (long strings), or none."""
    headers = {}
    if propagate is not None:
        propagate.inject(headers)  # the global propagator: W3C trace context by default
    if "traceparent" not in headers and os.environ.get("TRACEPARENT"):
        headers["traceparent"] = os.environ["TRACEPARENT"]
        if os.environ.get("TRACESTATE"):
            headers["tracestate"] = os.environ["TRACESTATE"]
    return headers or None


def json_value(text):
    try:
        return json.loads(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not JSON: {err}") from None


def main():
    parser = argparse.ArgumentParser(description="Publish one job to quota-worker.")
    parser.add_argument("--recipient", required=True, help="opaque: a phone number, an email, a user id")
    parser.add_argument("--channel", required=True, help="a configured channel, e.g. sms, email, push")
    parser.add_argument("--category", help="selects the quota policy (default: default)")
    parser.add_argument("--timezone", help="the recipient's IANA zone, e.g. Asia/Shanghai")
    parser.add_argument("--tenant", help="the recipient's tenant: counted apart from other tenants'")
    parser.add_argument("--payload", type=json_value, help="any JSON, passed through untouched")
    parser.add_argument(
        "--priority",
        choices=("urgent", "normal", "bulk"),
        help="its lane while its channel's rate makes it wait (default: its policy's)",
    )
    parser.add_argument(
        "--fallback",
        help="further channels, in order, comma-separated (e.g. email,sms): tried when the channel refuses it",
    )
    parser.add_argument("--id", help="the idempotency key (default: a new UUID)")
    args = parser.parse_args()

    job = {"id": args.id or str(uuid.uuid4()), "recipient": args.recipient, "channel": args.channel}
    for field in ("category", "timezone", "tenant", "priority", "payload"):
        if getattr(args, field) is not None:
            job[field] = getattr(args, field)
    if args.fallback is not None:
        job["fallback"] = [c for c in args.fallback.split(",") if c]
    # compact UTF-8 JSON; the worker dispatches these bytes as they are
    body = json.dumps(job, ensure_ascii=False, separators=(",", ":")).encode("utf-8")

    url = os.environ.get("QUOTA_WORKER__AMQP__URL") or DEFAULT_URL
    exchange = os.environ.get("QUOTA_WORKER__AMQP__JOBS_EXCHANGE") or "notify.jobs"
    routing_key = ""  # the jobs exchange is a fanout: it ignores it
    if args.priority:
        # a job that knows its lane goes straight to it: the lanes exchange routes
        # "<channel>.<priority>" (a channel without lanes: on to the jobs exchange)
        exchange = os.environ.get("QUOTA_WORKER__LANES__EXCHANGE") or "notify.lanes"
        routing_key = f"{args.channel}.{args.priority}"
    try:
        connection = pika.BlockingConnection(pika.URLParameters(url))
        try:
            channel = connection.channel()
            # publisher confirms: basic_publish returns once the broker has the job,
            # and raises NackError (refused) or UnroutableError (mandatory, returned)
            channel.confirm_delivery()
            channel.basic_publish(
                exchange=exchange,
                routing_key=routing_key,
                body=body,
                properties=pika.BasicProperties(
                    delivery_mode=pika.DeliveryMode.Persistent,  # 2: survives a broker restart
                    content_type="application/json",
                    message_id=job["id"],
                    headers=trace_headers(),
                ),
                mandatory=True,
            )
        finally:
            if connection.is_open:
                connection.close()
    except UnroutableError:
        sys.exit(
            f"job {job['id']} came back unroutable: no queue is bound to {exchange} "
            "(start the worker once: it declares its topology)"
        )
    except AMQPError as err:
        sys.exit(f"publishing job {job['id']} to {exchange}: {err!r}")
    print(job["id"])


if __name__ == "__main__":
    main()
