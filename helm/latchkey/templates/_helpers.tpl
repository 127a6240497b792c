{{/*
Names. Every resource is <fullname>-<component>; fullname is the release
name, with the chart name appended unless the release name contains it.
*/}}
{{- define "latchkey.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "latchkey.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Truncated to 40 above so that "<fullname>-cell-headless" and the pod
names under it stay within DNS's 63-character labels. */}}
{{- define "latchkey.cell.name" -}}{{ include "latchkey.fullname" . }}-cell{{- end -}}
{{- define "latchkey.cell.headless" -}}{{ include "latchkey.fullname" . }}-cell-headless{{- end -}}
{{- define "latchkey.proxy.name" -}}{{ include "latchkey.fullname" . }}-proxy{{- end -}}
{{- define "latchkey.backup.name" -}}{{ include "latchkey.fullname" . }}-backup{{- end -}}

{{- define "latchkey.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "latchkey.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Labels. Call with (dict "ctx" $ "component" "cell"). */}}
{{- define "latchkey.selectorLabels" -}}
app.kubernetes.io/name: {{ include "latchkey.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "latchkey.labels" -}}
{{ include "latchkey.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: latchkey
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}


{{/* The image: repository@digest, else repository:tag (appVersion by default). */}}
{{- define "latchkey.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "latchkey.backup.image" -}}
{{- $b := .Values.backup.image -}}
{{- if not $b.repository -}}
{{- include "latchkey.image" . -}}
{{- else if $b.digest -}}
{{- printf "%s@%s" $b.repository $b.digest -}}
{{- else -}}
{{- printf "%s:%s" $b.repository (default .Chart.AppVersion $b.tag) -}}
{{- end -}}
{{- end -}}

{{/* The directory Job's image (directoryJob.image): curl and a shell. */}}
{{- define "latchkey.directoryJob.image" -}}
{{- $i := .Values.directoryJob.image -}}
{{- if $i.digest -}}
{{- printf "%s@%s" $i.repository $i.digest -}}
{{- else if $i.tag -}}
{{- printf "%s:%s" $i.repository (toString $i.tag) -}}
{{- else -}}
{{- fail "directoryJob.image needs a tag or a digest" -}}
{{- end -}}
{{- end -}}

{{/*
Every cell: the home cell (`cell`, the one the proxies are started with,
which holds the directory) first, then each of `cells`. Sets key "cells"
of .into to a list of dicts:
  home       true for the home cell
  cell       its name in the directory ("home" for the home cell)
  name       the StatefulSet's, the client Service's and the PDB's name
  headless   the peers' headless Service
  component  the app.kubernetes.io/component of its pods ("cell" for home:
             the other cells' must differ, or home's selectors, fixed at
             install, would take their pods in)
  replicas   bootstrap voters; learners: pods after them
  prefixes   the prefixes it owns (the directory Job assigns them)
Every other setting is `cell`'s. Call with (dict "ctx" $ "into" $holder).
*/}}
{{- define "latchkey.cells.collect" -}}
{{- $ctx := .ctx -}}
{{- $home := include "latchkey.cell.name" $ctx -}}
{{- $cells := list (dict "home" true "cell" "home" "name" $home "headless" (include "latchkey.cell.headless" $ctx) "component" "cell" "replicas" $ctx.Values.cell.replicas "learners" $ctx.Values.cell.learners "prefixes" list) -}}
{{- $seen := dict -}}
{{- $prefixes := dict -}}
{{- range $ctx.Values.cells -}}
{{- if or (eq .name "home") (eq .name "headless") (hasSuffix "-headless" .name) -}}
{{- fail (printf `cells: %q is not a cell name the chart can use ("home" is the home cell's name in the directory; "headless" and names ending in "-headless" would collide with a headless Service)` .name) -}}
{{- end -}}
{{- if hasKey $seen .name -}}
{{- fail (printf "cells: %q is listed twice" .name) -}}
{{- end -}}
{{- $_ := set $seen .name true -}}
{{- $cellName := .name -}}
{{- $name := printf "%s-%s" $home .name -}}
{{- /* A StatefulSet's pods carry the label controller-revision-hash=<name>-<10 characters>, at most 63. */ -}}
{{- if gt (len $name) 52 -}}
{{- fail (printf "cells: the StatefulSet of cell %q would be named %s (%d characters); the most Kubernetes takes is 52. Use a shorter cell name or fullnameOverride." .name $name (len $name)) -}}
{{- end -}}
{{- range $p := (.prefixes | default list) -}}
{{- range $other, $owner := $prefixes -}}
{{- if or (hasPrefix $other $p) (hasPrefix $p $other) -}}
{{- fail (printf "cells: prefix %q (cell %s) and prefix %q (cell %s) overlap; a key belongs to one cell" $p $cellName $other $owner) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $prefixes $p $cellName -}}
{{- end -}}
{{- $replicas := $ctx.Values.cell.replicas -}}
{{- if hasKey . "replicas" -}}
{{- $replicas = .replicas -}}
{{- end -}}
{{- $cells = append $cells (dict "home" false "cell" .name "name" $name "headless" (printf "%s-headless" $name) "component" (printf "cell-%s" .name) "replicas" $replicas "learners" (.learners | default 0) "prefixes" (.prefixes | default list)) -}}
{{- end -}}
{{- $_ := set .into "cells" $cells -}}
{{- end -}}

{{/* A cell's voters at bootstrap, its quorum. Call with a cell of latchkey.cells.collect. */}}
{{- define "latchkey.c.quorum" -}}
{{- add (div (int .replicas) 2) 1 -}}
{{- end -}}

{{/*
The PodDisruptionBudget's minAvailable: every pod but the failures the
bootstrap voters tolerate, (replicas-1)/2. With no learners it is the
quorum; with learners (promoted or not) no eviction can take the voters
below their quorum either, whichever pods it picks.
*/}}
{{- define "latchkey.c.minAvailable" -}}
{{- add (include "latchkey.c.quorum" . | int) (int .learners) -}}
{{- end -}}

{{/* Every pod: voters, then learners. */}}
{{- define "latchkey.c.pods" -}}
{{- add (int .replicas) (int .learners) -}}
{{- end -}}

{{/* <headless service>.<namespace>.svc.<cluster domain>. Call with (dict "ctx" $ "c" $cell). */}}
{{- define "latchkey.c.peerDomain" -}}
{{- printf "%s.%s.svc.%s" .c.headless .ctx.Release.Namespace .ctx.Values.clusterDomain -}}
{{- end -}}

{{/*
host:port of the client API of a cell's first `count` pods, comma
separated (all pods: the proxies' --cells). Call with
(dict "ctx" $ "c" $cell "count" N).
*/}}
{{- define "latchkey.c.clientAddrs" -}}
{{- $ctx := .ctx -}}
{{- $c := .c -}}
{{- $addrs := list -}}
{{- range $i := until (int .count) -}}
{{- $addrs = append $addrs (printf "%s-%d.%s:%d" $c.name $i (include "latchkey.c.peerDomain" (dict "ctx" $ctx "c" $c)) (int $ctx.Values.cell.ports.client)) -}}
{{- end -}}
{{- join "," $addrs -}}
{{- end -}}

{{/* The same, of the home cell (`cell`). */}}
{{- define "latchkey.cell.home" -}}
{{- toJson (dict "name" (include "latchkey.cell.name" .) "headless" (include "latchkey.cell.headless" .) "replicas" .Values.cell.replicas "learners" .Values.cell.learners) -}}
{{- end -}}
{{- define "latchkey.cell.pods" -}}
{{- include "latchkey.c.pods" (include "latchkey.cell.home" . | fromJson) -}}
{{- end -}}
{{/* Call with (dict "ctx" $ "count" N). */}}
{{- define "latchkey.cell.clientAddrs" -}}
{{- include "latchkey.c.clientAddrs" (dict "ctx" .ctx "c" (include "latchkey.cell.home" .ctx | fromJson) "count" .count) -}}
{{- end -}}

{{/* The TLS Secrets' names (values.yaml: tls). */}}
{{- define "latchkey.tls.cellSecret" -}}
{{- .Values.tls.cellSecretName | default (printf "%s-cell-tls" (include "latchkey.fullname" .)) -}}
{{- end -}}
{{- define "latchkey.tls.proxySecret" -}}
{{- .Values.tls.proxySecretName | default (printf "%s-proxy-tls" (include "latchkey.fullname" .)) -}}
{{- end -}}

{{/* The Secret of the root and proxy passwords. */}}
{{- define "latchkey.auth.secret" -}}
{{- .Values.auth.secretName | default (printf "%s-auth" (include "latchkey.fullname" .)) -}}
{{- end -}}

{{/* Where the proxies' password is mounted. */}}
{{- define "latchkey.auth.dir" -}}/etc/latchkey-auth{{- end -}}

{{/* The Secret of the proxies' key (key proxy.key). */}}
{{- define "latchkey.proxyKey.secret" -}}
{{- .Values.proxyKey.secretName | default (printf "%s-proxy-key" (include "latchkey.fullname" .)) -}}
{{- end -}}

{{/* Where the proxies' key is mounted, in the members and the proxies. */}}
{{- define "latchkey.proxyKey.dir" -}}/etc/latchkey-proxy-key{{- end -}}

{{/* Where a TLS Secret is mounted. */}}
{{- define "latchkey.tls.dir" -}}/etc/latchkey-tls{{- end -}}

{{/*
etcdctl over TLS with the mounted Secret (ETCDCTL_* variables: the
endpoints stay host:port, which etcdctl dials with TLS once a CA is given).
*/}}
{{- define "latchkey.tls.etcdctlEnv" -}}
- name: ETCDCTL_CACERT
  value: {{ include "latchkey.tls.dir" . }}/ca.crt
- name: ETCDCTL_CERT
  value: {{ include "latchkey.tls.dir" . }}/tls.crt
- name: ETCDCTL_KEY
  value: {{ include "latchkey.tls.dir" . }}/tls.key
{{- end -}}

{{/* The cell Secret as a volume named "tls". */}}
{{- define "latchkey.tls.cellVolume" -}}
- name: tls
  secret:
    secretName: {{ include "latchkey.tls.cellSecret" . }}
{{- end -}}

{{/* The proxies' gRPC Service as host:port. */}}
{{- define "latchkey.proxy.grpcAddr" -}}
{{- printf "%s.%s.svc.%s:%d" (include "latchkey.proxy.name" .) .Release.Namespace .Values.clusterDomain (int .Values.proxy.ports.grpc) -}}
{{- end -}}

{{/*
Scheduling: topology spread over zones and nodes, and node anti-affinity.
Call with (dict "ctx" $ "component" "cell" "values" .Values.cell).
*/}}
{{- define "latchkey.topologySpread" -}}
{{- if .values.topologySpreadConstraints }}
{{- toYaml .values.topologySpreadConstraints }}
{{- else }}
- maxSkew: 1
  topologyKey: topology.kubernetes.io/zone
  whenUnsatisfiable: {{ .values.spread.zone }}
  labelSelector:
    matchLabels:
      {{- include "latchkey.selectorLabels" . | nindent 6 }}
- maxSkew: 1
  topologyKey: kubernetes.io/hostname
  whenUnsatisfiable: {{ .values.spread.node }}
  labelSelector:
    matchLabels:
      {{- include "latchkey.selectorLabels" . | nindent 6 }}
{{- end }}
{{- end -}}

{{- define "latchkey.affinity" -}}
{{- if .values.affinity }}
{{- toYaml .values.affinity }}
{{- else if eq .values.antiAffinity "hard" }}
podAntiAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    - topologyKey: kubernetes.io/hostname
      labelSelector:
        matchLabels:
          {{- include "latchkey.selectorLabels" . | nindent 10 }}
{{- else if eq .values.antiAffinity "soft" }}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "latchkey.selectorLabels" . | nindent 12 }}
{{- end }}
{{- end -}}

{{/* An httpGet probe on the metrics port. Call with (dict "path" "/readyz" "probe" .Values.cell.readinessProbe). */}}
{{- define "latchkey.probe" -}}
httpGet:
  path: {{ .path }}
  port: metrics
initialDelaySeconds: {{ .probe.initialDelaySeconds }}
periodSeconds: {{ .probe.periodSeconds }}
timeoutSeconds: {{ .probe.timeoutSeconds }}
failureThreshold: {{ .probe.failureThreshold }}
successThreshold: {{ .probe.successThreshold }}
{{- end -}}

{{/*
Prometheus label matchers for each tier's series, as the Prometheus
Operator labels them (namespace, and job = the scraped Service's name).
A cell's: call with (dict "ctx" $ "c" $cell).
*/}}
{{- define "latchkey.cell.promSelector" -}}
namespace="{{ .ctx.Release.Namespace }}", job="{{ .c.headless }}"
{{- end -}}
{{- define "latchkey.proxy.promSelector" -}}
namespace="{{ .Release.Namespace }}", job="{{ include "latchkey.proxy.name" . }}"
{{- end -}}

{{/*
A cell's bootstrap voter count is fixed at install: Raft membership lives
in the cell. On an upgrade, refuse a changed replicas rather than let a
resized StatefulSet start pods that bootstrap a second cell. (lookup sees the
cluster only in a real install or upgrade, not in `helm template`.)
Call with (dict "ctx" $ "c" $cell).
*/}}
{{- define "latchkey.cell.guardReplicas" -}}
{{- $sts := lookup "apps/v1" "StatefulSet" .ctx.Release.Namespace .c.name -}}
{{- if $sts -}}
{{- $was := index ($sts.metadata.annotations | default dict) "latchkey.io/voters" | default "" -}}
{{- if and $was (ne $was (toString .c.replicas)) -}}
{{- if .c.home -}}
{{- fail (printf "cell.replicas is the cell's bootstrap voter count (%s at install) and cannot change: a resized StatefulSet does not change Raft membership. Keep cell.replicas=%s; to grow, raise cell.learners and promote the new member (etcdctl member promote); to shrink, etcdctl member remove first. See the README, Running on Kubernetes." $was $was) -}}
{{- else -}}
{{- fail (printf "the replicas of cell %s (cells, name %s) are its bootstrap voter count (%s at install) and cannot change: a resized StatefulSet does not change Raft membership. Keep replicas: %s for it; to grow, raise its learners and promote the new member (etcdctl member promote); to shrink, etcdctl member remove first. See the README, Running on Kubernetes." .c.cell .c.cell $was $was) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
