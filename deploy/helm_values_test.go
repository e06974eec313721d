package deploy_test

// The chart rendered with each kind of deployment's values: what the
// Deployment, its Secret and its ServiceMonitor then hold.

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
)

func TestChartDefaultsStandalone(t *testing.T) {
	vals := minimalValues()
	// As helm install -f reads a values file: its numbers are float64.
	extra, err := chartutil.ReadValues([]byte(`
config:
  heartbeat: 20s
  log-level: debug
  max-conns-per-ip: 0
  session-negative-entries: 1000000
  auth-failure-rate: 0.5
extraArgs: ["--write-timeout=5s"]
`))
	if err != nil {
		t.Fatal(err)
	}
	maps.Copy(vals, extra)
	m := render(t, vals)
	e := env(container(m))

	for _, name := range []string{"PUSHD_REDIS_CLUSTER", "PUSHD_REDIS_CACHE_URL", "PUSHD_REDIS_CONTROL_URL", "PUSHD_REDIS_REALTIME_URL", "PUSHD_STREAMS"} {
		if v, ok := e[name]; ok {
			t.Errorf("%s set by default: %+v", name, v)
		}
	}
	if len(m.monitors) != 0 {
		t.Errorf("a ServiceMonitor by default")
	}
	if got := secretData(t, m, "redis-url"); got != redisSentinel {
		t.Errorf("Secret redis-url %q, want the value given", got)
	}
	if got := secretData(t, m, "database-url"); got != pgSentinel {
		t.Errorf("Secret database-url %q, want the value given", got)
	}
	want := map[string]string{
		"PUSHD_DRAIN_TIMEOUT": "20s", "PUSHD_RECONNECT_AFTER": "5s", "PUSHD_MAX_CONNS": "15000",
		"PUSHD_EXPECTED_NODES": "3", "PUSHD_HEARTBEAT": "20s", "PUSHD_LOG_LEVEL": "debug",
		"PUSHD_MAX_CONNS_PER_IP": "0", "PUSHD_SESSION_NEGATIVE_ENTRIES": "1000000",
		"PUSHD_AUTH_FAILURE_RATE": "0.5", "GOMEMLIMIT": "691MiB",
	}
	for name, v := range want {
		if e[name].Value != v {
			t.Errorf("%s %q, want %q", name, e[name].Value, v)
		}
	}
	// The secret files are readable by the image's group (fsGroup), never
	// by others.
	_, gid := imageUser(t)
	pod := m.deployment.Spec.Template.Spec
	if v := pod.Volumes[0]; v.Secret == nil || v.Secret.DefaultMode == nil || *v.Secret.DefaultMode != 0o440 ||
		pod.SecurityContext.FSGroup == nil || *pod.SecurityContext.FSGroup != gid {
		t.Errorf("secret volume %+v with fsGroup %v: want mode 0440 and the image's group", v.VolumeSource.Secret, pod.SecurityContext.FSGroup)
	}
	if f := e["PUSHD_NODE_NAME"].ValueFrom; f == nil || f.FieldRef == nil || f.FieldRef.FieldPath != "metadata.name" {
		t.Errorf("PUSHD_NODE_NAME %+v, want the pod's name", e["PUSHD_NODE_NAME"])
	}
	if g := *pod.TerminationGracePeriodSeconds; g != 10+20+10 {
		t.Errorf("grace %ds, want preStop 10 + drain 20 + margin 10", g)
	}
	if got := container(m).Args; !slices.Equal(got, []string{"--write-timeout=5s"}) {
		t.Errorf("args %v", got)
	}
	if d := m.deployment.Spec; d.MinReadySeconds != 5+10 || d.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 0 {
		t.Errorf("minReadySeconds %d, maxUnavailable %v: want 15 (reconnect-after + half the drain) and 0", d.MinReadySeconds, d.Strategy.RollingUpdate.MaxUnavailable)
	}
	if _, ok := m.deployment.Spec.Template.Annotations["checksum/secret"]; !ok {
		t.Error("pods carry no checksum of the chart's Secret: a changed secret would not roll them")
	}
	for _, s := range []string{"terminationGracePeriodSeconds", "40s", "process_max_fds", "16000"} {
		if !strings.Contains(m.notes, s) {
			t.Errorf("NOTES.txt lacks %q:\n%s", s, m.notes)
		}
	}
}

func TestChartRedisCluster(t *testing.T) {
	vals := minimalValues()
	s := vals["secrets"].(map[string]any)
	delete(s, "redisUrl")
	s["redisClusterSeeds"] = []any{"rediss://pushd:seed-sentinel-pw@10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"}
	vals["redis"] = map[string]any{"mode": "cluster"}
	vals["streams"] = map[string]any{"enabled": true}
	m := render(t, vals)
	e := env(container(m))
	if e["PUSHD_REDIS_CLUSTER"].Value != "true" {
		t.Errorf("PUSHD_REDIS_CLUSTER %+v, want true", e["PUSHD_REDIS_CLUSTER"])
	}
	for _, name := range []string{"PUSHD_REDIS_CACHE_URL", "PUSHD_REDIS_CONTROL_URL", "PUSHD_REDIS_REALTIME_URL"} {
		if v, ok := e[name]; ok {
			t.Errorf("%s set in cluster mode: %+v", name, v)
		}
	}
	if got, want := secretData(t, m, "redis-url"), "rediss://pushd:seed-sentinel-pw@10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379"; got != want {
		t.Errorf("Secret redis-url %q, want the seeds %q", got, want)
	}
	if e["PUSHD_STREAMS"].Value != "true" || e["PUSHD_STREAM_MAXLEN"].Value != "10000" {
		t.Errorf("streams: PUSHD_STREAMS %q, PUSHD_STREAM_MAXLEN %q", e["PUSHD_STREAMS"].Value, e["PUSHD_STREAM_MAXLEN"].Value)
	}
	if v, ok := e["PUSHD_READ_CHANGES"]; ok {
		t.Errorf("PUSHD_READ_CHANGES set by default: %+v", v)
	}
	vals["database"] = map[string]any{"enabled": true, "readChanges": true}
	if e := env(container(render(t, vals))); e["PUSHD_READ_CHANGES"].Value != "true" {
		t.Errorf("database.readChanges: PUSHD_READ_CHANGES %+v, want true", e["PUSHD_READ_CHANGES"])
	}
}

func TestChartStandaloneRoleURLs(t *testing.T) {
	vals := minimalValues()
	vals["secrets"].(map[string]any)["redisControlUrl"] = "redis://:redis-sentinel-pw@control:6379/0"
	vals["redis"] = map[string]any{"separateRoles": []any{"control"}, "keyPrefix": "staging:"}
	m := render(t, vals)
	e := env(container(m))
	ref := e["PUSHD_REDIS_CONTROL_URL"].ValueFrom
	if ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Key != "redis-control-url" {
		t.Errorf("PUSHD_REDIS_CONTROL_URL %+v, want the Secret's redis-control-url", e["PUSHD_REDIS_CONTROL_URL"])
	}
	for _, name := range []string{"PUSHD_REDIS_CLUSTER", "PUSHD_REDIS_CACHE_URL", "PUSHD_REDIS_REALTIME_URL"} {
		if v, ok := e[name]; ok {
			t.Errorf("%s set: %+v", name, v)
		}
	}
	if e["PUSHD_KEY_PREFIX"].Value != "staging:" {
		t.Errorf("PUSHD_KEY_PREFIX %q", e["PUSHD_KEY_PREFIX"].Value)
	}
}

func TestChartExistingSecret(t *testing.T) {
	vals := map[string]any{
		"secrets": map[string]any{
			"existingSecret": "pushd-prod",
			"keys":           map[string]any{"databaseUrl": "pg-url", "jwtPublicKey": "tokens.pem"},
		},
		"auth":  map[string]any{"jwt": "publicKey"},
		"drain": map[string]any{"preStopSleepSeconds": 5, "timeoutSeconds": 45},
	}
	m := render(t, vals)
	// The grace period and the rollout's pace follow the drain.
	if g := *m.deployment.Spec.Template.Spec.TerminationGracePeriodSeconds; g != 5+45+10 {
		t.Errorf("grace %ds, want preStop 5 + drain 45 + margin 10", g)
	}
	if r := m.deployment.Spec.MinReadySeconds; r != 5+22 {
		t.Errorf("minReadySeconds %d, want reconnect-after 5 + half of drain 45", r)
	}
	if len(m.secrets) != 0 {
		t.Errorf("%d Secrets rendered beside the existing one", len(m.secrets))
	}
	c := container(m)
	e := env(c)
	for _, name := range []string{"PUSHD_REDIS_URL", "PUSHD_DATABASE_URL"} {
		if ref := e[name].ValueFrom.SecretKeyRef; ref.Name != "pushd-prod" {
			t.Errorf("%s from Secret %s, want pushd-prod", name, ref.Name)
		}
	}
	if k := e["PUSHD_DATABASE_URL"].ValueFrom.SecretKeyRef.Key; k != "pg-url" {
		t.Errorf("PUSHD_DATABASE_URL from key %s, want pg-url", k)
	}
	if got := e["PUSHD_JWT_PUBLIC_KEY"].Value; got != "/etc/pushd/secrets/tokens.pem" {
		t.Errorf("PUSHD_JWT_PUBLIC_KEY %q", got)
	}
	if _, ok := e["PUSHD_JWT_SECRET_FILE"]; ok {
		t.Error("PUSHD_JWT_SECRET_FILE set with auth.jwt=publicKey")
	}
	if _, ok := m.deployment.Spec.Template.Annotations["checksum/secret"]; ok {
		t.Error("a checksum of a Secret the chart does not render")
	}
}

func TestChartServiceMonitor(t *testing.T) {
	vals := minimalValues()
	vals["serviceMonitor"] = map[string]any{"enabled": true, "labels": map[string]any{"release": "prometheus"}}
	vals["port"], vals["service"] = 9000, map[string]any{"port": 80}
	m := render(t, vals)
	if p := m.service.Spec.Ports[0]; p.Port != 80 || container(m).Ports[0].ContainerPort != 9000 {
		t.Errorf("Service port %d to container port %d, want 80 to 9000", p.Port, container(m).Ports[0].ContainerPort)
	}
	if len(m.monitors) != 1 {
		t.Fatalf("%d ServiceMonitors, want 1", len(m.monitors))
	}
	sm := m.monitors[0]
	if sm.Labels["release"] != "prometheus" {
		t.Errorf("ServiceMonitor labels %v, want release=prometheus", sm.Labels)
	}
	if ep := sm.Spec.Endpoints[0]; ep.Interval != "30s" {
		t.Errorf("interval %q", ep.Interval)
	}
}
