{{/*
groupgate as a native sidecar (Kubernetes >= 1.29: an init container with restartPolicy
Always starts before the application's containers and stops after them). Include it under
your pod's initContainers, with the chart's values as .Values:

  initContainers:
    {{- include "groupgate.sidecar" (dict "Values" .Values.groupgate "Release" .Release "Chart" .Chart) | nindent 4 }}
  volumes:
    {{- include "groupgate.volumes" (dict "Values" .Values.groupgate) | nindent 4 }}
*/}}
{{- define "groupgate.sidecar" -}}
{{- $v := .Values -}}
{{- $env := dict -}}
{{- $_ := set $env "upstream" (required "upstream (the Kafka cluster's bootstrap servers) is required" $v.upstream) -}}
{{- $_ := set $env "listen" $v.listen -}}
{{- $_ := set $env "fleet-listen" (printf "0.0.0.0:%v" $v.fleet.port) -}}
{{- $_ := set $env "metrics-listen" (printf "0.0.0.0:%v" $v.metrics.port) -}}
{{- $_ := set $env "shutdown-grace" (include "groupgate.string" $v.shutdownGrace) -}}
{{- with $v.sasl.existingSecret -}}
{{- $_ := set $env "sasl-username-file" (printf "/etc/groupgate/sasl/%s" $v.sasl.usernameKey) -}}
{{- $_ := set $env "sasl-password-file" (printf "/etc/groupgate/sasl/%s" $v.sasl.passwordKey) -}}
{{- end -}}
{{- range $prefix, $tls := dict "tls" $v.tls "fleet-tls" $v.fleetTls -}}
{{- if $tls.existingSecret -}}
{{- range $part := list "ca" "cert" "key" -}}
{{- $key := get $tls (printf "%sKey" $part) -}}
{{- if $key -}}
{{- $_ := set $env (printf "%s-%s-file" $prefix $part) (printf "/etc/groupgate/%s/%s" $prefix $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $known := include "groupgate.knownSettings" . | splitList "\n" -}}
{{- range $name, $value := $v.settings -}}
{{- if not (has $name $known) -}}
{{- fail (printf "settings.%s: groupgate has no such setting (docs/configuration.md)" $name) -}}
{{- end -}}
{{- $_ := set $env $name (include "groupgate.string" $value) -}}
{{- end -}}
- name: groupgate
  image: "{{ $v.image.repository }}:{{ default .Chart.AppVersion $v.image.tag }}"
  imagePullPolicy: {{ $v.image.pullPolicy }}
  restartPolicy: Always
  {{- with $v.extraArgs }}
  args:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  env:
    {{- if not (hasKey $env "fleet-address") }}
    # Where the other pods' sidecars relay the group requests of groups this one coordinates:
    # the pod's own address (its fleet port is fleet-listen's).
    - name: GROUPGATE_FLEET_ADDRESS
      valueFrom: {fieldRef: {fieldPath: status.podIP}}
    {{- end }}
    {{- range $name := keys $env | sortAlpha }}
    - name: GROUPGATE_{{ $name | upper | replace "-" "_" }}
      value: {{ get $env $name | quote }}
    {{- end }}
  ports:
    - {name: fleet, containerPort: {{ $v.fleet.port }}, protocol: TCP}
    - {name: metrics, containerPort: {{ $v.metrics.port }}, protocol: TCP}
  # Ready means "the cluster is reachable", never "my group has a coordinator": the
  # application starts as soon as its sidecar can reach Kafka.
  startupProbe:
    httpGet: {path: /readyz, port: metrics}
    {{- toYaml $v.probes.startup | nindent 4 }}
  livenessProbe:
    httpGet: {path: /livez, port: metrics}
    {{- toYaml $v.probes.liveness | nindent 4 }}
  readinessProbe:
    httpGet: {path: /readyz, port: metrics}
    {{- toYaml $v.probes.readiness | nindent 4 }}
  {{- with $v.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- $mounts := include "groupgate.volumeMounts" . | trim }}
  {{- if $mounts }}
  volumeMounts:
    {{- $mounts | nindent 4 }}
  {{- end }}
{{- end -}}

{{- define "groupgate.volumeMounts" -}}
{{- $v := .Values -}}
{{- with $v.sasl.existingSecret }}
- {name: groupgate-sasl, mountPath: /etc/groupgate/sasl, readOnly: true}
{{- end }}
{{- with $v.tls.existingSecret }}
- {name: groupgate-tls, mountPath: /etc/groupgate/tls, readOnly: true}
{{- end }}
{{- with $v.fleetTls.existingSecret }}
- {name: groupgate-fleet-tls, mountPath: /etc/groupgate/fleet-tls, readOnly: true}
{{- end }}
{{- range $v.secretMounts }}
- {name: {{ .name }}, mountPath: {{ .mountPath }}, readOnly: true}
{{- end }}
{{- end -}}

{{/* The Secrets the sidecar mounts: include under the pod's volumes. */}}
{{- define "groupgate.volumes" -}}
{{- $v := .Values -}}
{{- with $v.sasl.existingSecret }}
- {name: groupgate-sasl, secret: {secretName: {{ . }}}}
{{- end }}
{{- with $v.tls.existingSecret }}
- {name: groupgate-tls, secret: {secretName: {{ . }}}}
{{- end }}
{{- with $v.fleetTls.existingSecret }}
- {name: groupgate-fleet-tls, secret: {secretName: {{ . }}}}
{{- end }}
{{- range $v.secretMounts }}
- {name: {{ .name }}, secret: {secretName: {{ .secretName }}}}
{{- end }}
{{- end -}}
