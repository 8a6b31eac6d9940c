// Validates Kubernetes manifests against the API's own schemas, offline:
//
//   node validate.mjs [--partial] FILE...
//
// Every document of every FILE (a YAML stream) must be an object of a kind
// known here. Core objects are validated twice: by kubernetes-models (the
// OpenAPI schema: types, required fields, enums, formats) and for fields the
// API does not have (@kubernetes/client-node's type maps, as the API server's
// strict field validation would reject them). An MPIJob, a custom resource
// neither package knows, is checked against the fields of kubeflow/mpi-operator
// pkg/apis/kubeflow/v2beta1/types.go (below), and its launcher and worker pod
// templates are validated as core PodTemplateSpecs. With --partial the
// documents are kustomize patches: only the unknown-field check applies.
//
// Prints one line per document; on any error names the file, the document,
// the object and the field, and exits 1 (2: bad usage or unreadable input).
import { readFileSync } from "node:fs";
import { parseAllDocuments } from "yaml";
import * as k8s from "@kubernetes/client-node";
import { ConfigMap } from "kubernetes-models/v1/ConfigMap";
import { PersistentVolumeClaim } from "kubernetes-models/v1/PersistentVolumeClaim";
import { PodTemplate } from "kubernetes-models/v1/PodTemplate";
import { Secret } from "kubernetes-models/v1/Secret";
import { Service } from "kubernetes-models/v1/Service";
import { Job } from "kubernetes-models/batch/v1/Job";

const CORE = {
  "v1/ConfigMap": [ConfigMap, "V1ConfigMap"],
  "v1/PersistentVolumeClaim": [PersistentVolumeClaim, "V1PersistentVolumeClaim"],
  "v1/Secret": [Secret, "V1Secret"],
  "v1/Service": [Service, "V1Service"],
  "batch/v1/Job": [Job, "V1Job"],
};

// kubeflow/mpi-operator pkg/apis/kubeflow/v2beta1/types.go: MPIJob, MPIJobSpec,
// RunPolicy, SchedulingPolicy and ReplicaSpec, by their json tags.
const MPI = {
  MPIJob: { apiVersion: "string", kind: "string", metadata: "V1ObjectMeta", spec: "MPIJobSpec", status: "any" },
  MPIJobSpec: {
    slotsPerWorker: "int",
    runLauncherAsWorker: "bool",
    runPolicy: "RunPolicy",
    mpiReplicaSpecs: "ReplicaSpecs",
    sshAuthMountPath: "string",
    launcherCreationPolicy: ["AtStartup", "WaitForWorkersReady"],
    mpiImplementation: ["OpenMPI", "Intel", "MPICH"],
  },
  RunPolicy: {
    cleanPodPolicy: ["All", "Running", "None"],
    ttlSecondsAfterFinished: "int",
    activeDeadlineSeconds: "int",
    backoffLimit: "int",
    schedulingPolicy: "SchedulingPolicy",
    suspend: "bool",
    managedBy: "string",
  },
  SchedulingPolicy: {
    minAvailable: "int",
    queue: "string",
    minResources: "any",
    priorityClass: "string",
    scheduleTimeoutSeconds: "int",
  },
  ReplicaSpec: { replicas: "int", template: "V1PodTemplateSpec", restartPolicy: ["Always", "OnFailure", "Never", "ExitCode"] },
};

/// Fields of `value` that the client-node type `type` lacks, recursively.
function unknownFields(value, type, path, errors) {
  if (value === null || value === undefined) return;
  let m;
  if ((m = /^Array<(.+)>$/.exec(type))) {
    if (Array.isArray(value)) value.forEach((v, i) => unknownFields(v, m[1], `${path}/${i}`, errors));
    return;
  }
  if ((m = /^\{ \[key: string\]: (.+); \}$/.exec(type))) {
    if (typeof value === "object") for (const [k, v] of Object.entries(value)) unknownFields(v, m[1], `${path}/${k}`, errors);
    return;
  }
  const cls = k8s[type];
  if (!cls || typeof cls.getAttributeTypeMap !== "function") return; // a scalar, IntOrString, Date
  if (typeof value !== "object" || Array.isArray(value)) return; // a type error: kubernetes-models reports it
  const fields = new Map(cls.getAttributeTypeMap().map((a) => [a.baseName, a.type]));
  for (const [k, v] of Object.entries(value)) {
    if (!fields.has(k)) errors.push(`${path}/${k}: unknown field (${type} has no '${k}')`);
    else unknownFields(v, fields.get(k), `${path}/${k}`, errors);
  }
}

/// kubernetes-models' schema errors, as "PATH: MESSAGE".
function schemaErrors(model, path, errors) {
  try {
    model.validate();
  } catch (e) {
    if (!e.errors) throw e;
    for (const err of e.errors) errors.push(`${path}${err.instancePath}: ${err.message}${err.params?.allowedValues ? ` (${err.params.allowedValues.join(", ")})` : ""}`);
  }
}

function checkPodTemplate(template, path, partial, errors) {
  unknownFields(template, "V1PodTemplateSpec", path, errors);
  if (partial) return;
  const errs = [];
  schemaErrors(new PodTemplate({ metadata: { name: "check" }, template }), "", errs);
  for (const e of errs) errors.push(e.replace(/^\/template/, path));
}

function checkMpi(value, type, path, partial, errors) {
  if (value === null || value === undefined) return;
  if (type === "any") return;
  if (type === "V1ObjectMeta") return unknownFields(value, type, path, errors);
  if (type === "V1PodTemplateSpec") return checkPodTemplate(value, path, partial, errors);
  if (Array.isArray(type)) {
    if (!type.includes(value)) errors.push(`${path}: must be one of ${type.join(", ")}, got ${JSON.stringify(value)}`);
    return;
  }
  const scalar = { int: Number.isInteger, bool: (v) => typeof v === "boolean", string: (v) => typeof v === "string" }[type];
  if (scalar) {
    if (!scalar(value)) errors.push(`${path}: must be ${type === "int" ? "an integer" : `a ${type}`}, got ${JSON.stringify(value)}`);
    return;
  }
  if (typeof value !== "object" || Array.isArray(value)) return errors.push(`${path}: must be an object`);
  if (type === "ReplicaSpecs") {
    for (const [k, v] of Object.entries(value)) {
      if (k !== "Launcher" && k !== "Worker") errors.push(`${path}/${k}: unknown replica type (Launcher, Worker)`);
      else checkMpi(v, "ReplicaSpec", `${path}/${k}`, partial, errors);
    }
    return;
  }
  for (const [k, v] of Object.entries(value)) {
    if (!(k in MPI[type])) errors.push(`${path}/${k}: unknown field (${type} has no '${k}')`);
    else checkMpi(v, MPI[type][k], `${path}/${k}`, partial, errors);
  }
  if (!partial && type === "MPIJobSpec" && !value.mpiReplicaSpecs) errors.push(`${path}/mpiReplicaSpecs: required`);
  if (!partial && type === "ReplicaSpec" && !value.template?.spec?.containers?.length)
    errors.push(`${path}/template/spec/containers: required (the operator runs the first container)`);
}

/// `value` without the strategic-merge-patch directives ($patch, $retainKeys, ...).
function withoutDirectives(value) {
  if (Array.isArray(value)) return value.map(withoutDirectives);
  if (!value || typeof value !== "object") return value;
  return Object.fromEntries(Object.entries(value).filter(([k]) => !k.startsWith("$")).map(([k, v]) => [k, withoutDirectives(v)]));
}

/// The errors of one document.
function check(doc, partial) {
  if (!doc || typeof doc !== "object" || Array.isArray(doc)) return ["not a Kubernetes object (a YAML mapping)"];
  if (partial) doc = withoutDirectives(doc);
  const key = `${doc.apiVersion}/${doc.kind}`;
  const errors = [];
  if (key === "kubeflow.org/v2beta1/MPIJob") {
    checkMpi(doc, "MPIJob", "", partial, errors);
    return errors;
  }
  const known = CORE[key];
  if (!known) return [`no schema here for apiVersion ${doc.apiVersion}, kind ${doc.kind} (known: ${[...Object.keys(CORE), "kubeflow.org/v2beta1/MPIJob"].join(", ")})`];
  const [Model, type] = known;
  unknownFields(doc, type, "", errors);
  if (!partial) schemaErrors(new Model(doc), "", errors);
  return errors;
}

const args = process.argv.slice(2);
const partial = args[0] === "--partial";
const files = partial ? args.slice(1) : args;
if (files.length === 0) {
  console.error("usage: node validate.mjs [--partial] FILE...");
  process.exit(2);
}
let failed = 0;
for (const file of files) {
  let docs;
  try {
    docs = parseAllDocuments(readFileSync(file, "utf8"), { version: "1.1" }); // as Kubernetes reads YAML
  } catch (e) {
    console.error(`${file}: cannot read: ${e.message}`);
    process.exit(2);
  }
  docs.forEach((d, i) => {
    const where = `${file}: document ${i + 1}`;
    if (d.errors?.length) {
      failed++;
      return console.error(`${where}: not valid YAML: ${d.errors[0].message}`);
    }
    const obj = d.toJS();
    const name = `${obj?.kind ?? "?"} ${obj?.metadata?.name ?? "?"}`;
    const errors = check(obj, partial);
    if (errors.length === 0) return console.log(`${where} (${name}): ok`);
    failed++;
    for (const e of errors) console.error(`${where} (${name}): ${e}`);
  });
}
process.exit(failed ? 1 : 0);
