#!/usr/bin/env node
// Publish one notification job to quota-worker and print its id.
//
//   node publish.js --recipient +8613800000000 --channel sms \
//     --timezone Asia/Shanghai --payload '{"text": "Your parcel is on its way"}'
//
// The job is the JSON object described in the top-level README ("A job, end to end"). It is
// published the way the worker expects: persistent, application/json, messageId =
// the job id, mandatory, and confirmed by the broker. Exits non-zero when the broker
// nacks the job or returns it as unroutable (no queue bound: the worker has not
// declared its topology yet).
'use strict';

const { randomUUID } = require('node:crypto');
const { parseArgs } = require('node:util');
const amqp = require('amqplib');

// optional: tracing (docs/guide/tracing.md). With @opentelemetry/api installed and an
// SDK registered, the job carries the active span's W3C traceparent/tracestate headers.
let otel = null;
try {
  otel = require('@opentelemetry/api');
} catch {
  otel = null;
}

function traceHeaders() {
  const headers = {};
  if (otel) otel.propagation.inject(otel.context.active(), headers);
  if (!headers.traceparent && process.env.TRACEPARENT) headers.traceparent = process.env.TRACEPARENT;
  return headers;
}

const url = process.env.QUOTA_WORKER__AMQP__URL || 'amqp://guest:guest@127.0.0.1:5672/%2f';
const jobsExchange = process.env.QUOTA_WORKER__AMQP__JOBS_EXCHANGE || 'notify.jobs';
const lanesExchange = process.env.QUOTA_WORKER__LANES__EXCHANGE || 'notify.lanes';
const LANES = ['urgent', 'normal', 'bulk'];

const USAGE = `usage: node publish.js --recipient R --channel C [--category C] [--timezone ZONE]
                       [--tenant T] [--payload JSON] [--priority urgent|normal|bulk] [--fallback C1,C2] [--id ID]`;

function readJob() {
  const { values } = parseArgs({
    options: {
      recipient: { type: 'string' }, // opaque: a phone number, an email, a user id
      channel: { type: 'string' }, // a configured channel, e.g. sms, email, push
      category: { type: 'string' }, // selects the quota policy (default: default)
      timezone: { type: 'string' }, // the recipient's IANA zone
      tenant: { type: 'string' }, // the recipient's tenant: counted apart from other tenants'
      fallback: { type: 'string' }, // further channels, in order, comma-separated: tried when the channel refuses it
      payload: { type: 'string' }, // any JSON, passed through untouched
      priority: { type: 'string' }, // its lane while its channel's rate makes it wait
      id: { type: 'string' }, // the idempotency key (default: a new UUID)
    },
  });
  if (!values.recipient || !values.channel) throw new Error('--recipient and --channel are required');
  const job = { id: values.id || randomUUID(), recipient: values.recipient, channel: values.channel };
  if (values.category !== undefined) job.category = values.category;
  if (values.timezone !== undefined) job.timezone = values.timezone;
  if (values.priority !== undefined) {
    if (!LANES.includes(values.priority)) throw new Error('--priority is urgent, normal or bulk');
    job.priority = values.priority;
  }
  if (values.tenant !== undefined) job.tenant = values.tenant;
  if (values.fallback !== undefined) job.fallback = values.fallback.split(',').filter(Boolean);
  if (values.payload !== undefined) {
    try {
      job.payload = JSON.parse(values.payload);
    } catch (err) {
      throw new Error(`--payload is not JSON: ${err.message}`);
    }
  }
  return job;
}

// A job that knows its lane goes straight to it: the lanes exchange routes
// "<channel>.<priority>" (a channel without lanes: on to the jobs exchange).
function destination(job) {
  return job.priority ? [lanesExchange, `${job.channel}.${job.priority}`] : [jobsExchange, ''];
}

async function publish(job) {
  const [exchange, routingKey] = destination(job);
  const connection = await amqp.connect(url);
  try {
    // publisher confirms: waitForConfirms() resolves once the broker has the job,
    // and rejects on a nack or when the broker closes the channel (no such exchange)
    const channel = await connection.createConfirmChannel();
    let returned = null;
    let channelError = null;
    channel.on('return', (message) => {
      returned = message; // mandatory and unroutable: sent back before the confirm
    });
    channel.on('error', (err) => {
      channelError = err; // reported below; without a listener it would crash the process
    });
    channel.publish(exchange, routingKey, Buffer.from(JSON.stringify(job)), {
      persistent: true, // delivery mode 2: survives a broker restart
      contentType: 'application/json',
      messageId: job.id,
      headers: traceHeaders(),
      mandatory: true,
    });
    try {
      await channel.waitForConfirms();
    } catch (err) {
      throw channelError || err;
    }
    if (returned) {
      throw new Error(
        `came back unroutable: no queue is bound to ${exchange} ` +
          '(start the worker once: it declares its topology)',
      );
    }
    await channel.close();
  } finally {
    await connection.close().catch(() => {});
  }
}

async function main() {
  let job;
  try {
    job = readJob();
  } catch (err) {
    console.error(`${err.message}\n${USAGE}`);
    process.exitCode = 2;
    return;
  }
  try {
    await publish(job);
  } catch (err) {
    console.error(`publishing job ${job.id} to ${destination(job)[0]}: ${err.message}`);
    process.exitCode = 1;
    return;
  }
  console.log(job.id);
}

main();
