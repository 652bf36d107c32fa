#!/usr/bin/env python3
"""Edit one recipient's own preferences through the worker's HTTP API and print the
set stored (JSON, with updated_at).

    python3 preferences.py +8613800000000 --opt-out marketing \
        --quiet 22:00-07:00 --timezone Asia/Shanghai

What a preference page's backend does: read the set (GET, 404 when there is none),
then send the change as a JSON merge patch (PATCH, RFC 7386: null removes a key), so
what the recipient did not touch stays as it is. The worker checks the result whole:
a refused set answers 400 naming its field, and nothing is stored.

Standard library only (urllib). The token is the worker's own variable,
QUOTA_WORKER__HTTP__API_TOKEN (http.api_token); --url is where the worker's
http.listen is reached. Exits 1 when the worker refuses, saying why.
"""

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request


def call(url, token, method, recipient, tenant, body=None):
    """One request to /v1/recipients/{recipient}/preferences: (status, JSON or None)."""
    path = "/v1/recipients/%s/preferences" % urllib.parse.quote(recipient, safe="")
    if tenant:
        path += "?" + urllib.parse.urlencode({"tenant": tenant})
    data = None if body is None else json.dumps(body).encode("utf-8")
    request = urllib.request.Request(url.rstrip("/") + path, data=data, method=method)
    request.add_header("Accept", "application/json")
    if token:
        request.add_header("Authorization", "Bearer " + token)
    if data is not None:
        request.add_header("Content-Type", "application/merge-patch+json")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read()
            return response.status, json.loads(text) if text else None
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            said = json.loads(text)
        except ValueError:
            said = {"error": text.decode("utf-8", "replace").strip()}
        return e.code, said


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipient", help="the recipient, as producers write it")
    parser.add_argument("--url", default="http://127.0.0.1:9464",
                        help="the worker's http.listen (default http://127.0.0.1:9464)")
    parser.add_argument("--tenant", help="the recipient's tenant, as jobs carry it")
    parser.add_argument("--opt-out", action="append", default=[], metavar="CATEGORY",
                        help="opt out of a category on every channel (repeatable)")
    parser.add_argument("--opt-in", action="append", default=[], metavar="CATEGORY",
                        help="remove a category's preference (allowed again)")
    parser.add_argument("--quiet", metavar="HH:MM-HH:MM",
                        help="quiet hours every day, e.g. 22:00-07:00 (past midnight allowed)")
    parser.add_argument("--timezone", help="the quiet hours' zone (default: the job's)")
    args = parser.parse_args()
    token = os.environ.get("QUOTA_WORKER__HTTP__API_TOKEN")

    status, current = call(args.url, token, "GET", args.recipient, args.tenant)
    if status == 404:
        current = {}
    elif status != 200:
        return refused(status, current)
    print("current set: %s" % json.dumps(current), file=sys.stderr)

    patch = {}
    categories = {c: False for c in args.opt_out}
    categories.update({c: None for c in args.opt_in})
    if categories:
        patch["categories"] = categories
    if args.quiet:
        start, _, end = args.quiet.partition("-")
        quiet = {"windows": [{"days": "daily", "from": start, "to": end}]}
        if args.timezone:
            quiet["timezone"] = args.timezone
        patch["quiet_hours"] = quiet
    status, stored = call(args.url, token, "PATCH", args.recipient, args.tenant, patch)
    if status != 200:
        return refused(status, stored)
    print(json.dumps(stored, sort_keys=True))
    return 0


def refused(status, said):
    said = said or {}
    field = " (field %s)" % said["field"] if said.get("field") else ""
    print("the worker answered %d: %s%s" % (status, said.get("error", ""), field),
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
