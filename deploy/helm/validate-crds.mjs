// Validates the KEDA and Prometheus Operator objects the chart renders against their
// schemas (@kubernetes-models/keda, @kubernetes-models/prometheus-operator), which
// kubernetes-validate does not know. Reads a JSON array of objects on stdin; prints
// one line per object; exits 1 when one is invalid or of a kind it has no model for.
import { ScaledObject } from "@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject";
import { TriggerAuthentication } from "@kubernetes-models/keda/keda.sh/v1alpha1/TriggerAuthentication";
import { ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor";
import { PrometheusRule } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/PrometheusRule";

const models = {
  "keda.sh/v1alpha1/ScaledObject": ScaledObject,
  "keda.sh/v1alpha1/TriggerAuthentication": TriggerAuthentication,
  "monitoring.coreos.com/v1/ServiceMonitor": ServiceMonitor,
  "monitoring.coreos.com/v1/PrometheusRule": PrometheusRule,
};

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const objects = JSON.parse(Buffer.concat(chunks).toString("utf8"));
let failed = 0;
for (const object of objects) {
  const what = `${object.apiVersion}/${object.kind}`;
  const name = `${what} ${object.metadata?.name}`;
  const Model = models[what];
  if (!Model) {
    console.log(`FAIL ${name}: no model for this kind`);
    failed++;
    continue;
  }
  try {
    new Model(object).validate();
    console.log(`ok   ${name}`);
  } catch (e) {
    console.log(`FAIL ${name}: ${e.message}`);
    failed++;
  }
}
process.exit(failed ? 1 : 0);
