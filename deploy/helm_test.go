package deploy_test

// The Helm chart in helm/pushd, checked without a cluster: rendered with
// Helm's own library (what helm template does), every object decoded as
// the API server decodes it with strict field validation (unknown,
// misspelt or duplicate fields fail), and the promises of
// docs/DEPLOYMENT.md ("Kubernetes") asserted on the typed objects.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
)

const chartDir = "helm/pushd"

// kubeVersion is the oldest Kubernetes the chart claims (Chart.yaml): the
// first with lifecycle.preStop.sleep on by default.
const kubeVersion = "v1.30.0"

// Sentinels stand for secret values: none may appear in the Deployment.
const (
	jwtSentinel   = "jwt-sentinel-0123456789abcdef0123456789abcdef"
	apiSentinel   = "api-sentinel-key"
	redisSentinel = "redis://:redis-sentinel-pw@redis:6379/0"
	pgSentinel    = "postgres://pushd:pg-sentinel-pw@postgres:5432/pushd"
)

func minimalValues() map[string]any {
	return map[string]any{"secrets": map[string]any{
		"jwtSecret": jwtSentinel, "apiKey": apiSentinel,
		"redisUrl": redisSentinel, "databaseUrl": pgSentinel,
	}}
}

type manifests struct {
	deployment *appsv1.Deployment
	service    *corev1.Service
	admin      *corev1.Service // the admin port's, with serviceMonitor.enabled
	pdb        *policyv1.PodDisruptionBudget
	secrets    []*corev1.Secret
	monitors   []*monitoringv1.ServiceMonitor
	policies   []*networkingv1.NetworkPolicy
	notes      string
}

// renderChart renders the chart in dir as helm template does for a
// release "edge" in namespace "push" on kubeVersion. Strict makes a
// template that reads a value values.yaml does not define fail.
func renderChart(dir string, vals map[string]any) (map[string]string, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return nil, err
	}
	caps := chartutil.DefaultCapabilities.Copy()
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		return nil, err
	}
	caps.KubeVersion = *kv
	top, err := chartutil.ToRenderValues(ch, vals, chartutil.ReleaseOptions{
		Name: "edge", Namespace: "push", Revision: 1, IsInstall: true,
	}, caps)
	if err != nil {
		return nil, err
	}
	return engine.Engine{Strict: true}.Render(ch, top)
}

var decoder = func() runtime.Decoder {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		appsv1.AddToScheme, corev1.AddToScheme, policyv1.AddToScheme, monitoringv1.AddToScheme, networkingv1.AddToScheme,
	} {
		if err := add(s); err != nil {
			panic(err)
		}
	}
	// The API server's own decoder: case-sensitive field names, unknown and
	// duplicate fields reported as strict decoding errors.
	return kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, s, s,
		kjson.SerializerOptions{Yaml: true, Strict: true})
}()

// decodeManifests decodes every rendered object into its API type.
func decodeManifests(files map[string]string) (*manifests, error) {
	m := &manifests{}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(files)) {
		base := filepath.Base(name)
		if base == "NOTES.txt" {
			m.notes = files[name]
			continue
		}
		if strings.HasPrefix(base, "_") {
			continue
		}
		docs := releaseutil.SplitManifests(files[name])
		for _, key := range slices.Sorted(maps.Keys(docs)) {
			doc := docs[key]
			if strings.TrimSpace(doc) == "" {
				continue
			}
			obj, _, err := decoder.Decode([]byte(doc), nil, nil)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				continue
			}
			switch o := obj.(type) {
			case *appsv1.Deployment:
				if m.deployment != nil {
					errs = append(errs, fmt.Errorf("%s: a second Deployment", name))
				}
				m.deployment = o
			case *corev1.Service:
				if strings.HasSuffix(o.Name, "-admin") {
					m.admin = o
					continue
				}
				if m.service != nil {
					errs = append(errs, fmt.Errorf("%s: a second Service", name))
				}
				m.service = o
			case *policyv1.PodDisruptionBudget:
				if m.pdb != nil {
					errs = append(errs, fmt.Errorf("%s: a second PodDisruptionBudget", name))
				}
				m.pdb = o
			case *corev1.Secret:
				m.secrets = append(m.secrets, o)
			case *monitoringv1.ServiceMonitor:
				m.monitors = append(m.monitors, o)
			case *networkingv1.NetworkPolicy:
				m.policies = append(m.policies, o)
			default:
				errs = append(errs, fmt.Errorf("%s: kind %T, which this test does not check", name, obj))
			}
		}
	}
	if len(errs) == 0 && (m.deployment == nil || m.service == nil || m.pdb == nil) {
		errs = append(errs, errors.New("want a Deployment, a Service and a PodDisruptionBudget"))
	}
	return m, errors.Join(errs...)
}

func render(t *testing.T, vals map[string]any) *manifests {
	t.Helper()
	files, err := renderChart(chartDir, vals)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	m, err := decodeManifests(files)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	checkManifests(t, m)
	return m
}

// settings are the flags of docs/CONFIG.md's table (kept equal to the
// flags by a test in cmd/pushd), each with its environment twin.
var settings = func() map[string]string {
	f, err := os.Open("../docs/CONFIG.md")
	if err != nil {
		panic(err)
	}
	defer f.Close()
	row := regexp.MustCompile("^\\| `--([a-z0-9-]+)` \\| `(PUSHD_[A-Z0-9_]+)` \\|")
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := row.FindStringSubmatch(sc.Text()); m != nil {
			out[m[2]] = m[1]
		}
	}
	if len(out) < 50 {
		panic(fmt.Sprintf("docs/CONFIG.md: %d settings found in the table", len(out)))
	}
	return out
}()

func isFlag(name string) bool {
	for _, f := range settings {
		if f == name {
			return true
		}
	}
	return false
}

// unknownSettings names the PUSHD_* variables and --flags of c that are
// no setting of pushd.
func unknownSettings(c corev1.Container) []string {
	var bad []string
	for _, e := range c.Env {
		if _, ok := settings[e.Name]; strings.HasPrefix(e.Name, "PUSHD_") && !ok {
			bad = append(bad, e.Name)
		}
	}
	for _, a := range append(slices.Clone(c.Command), c.Args...) {
		if name, ok := strings.CutPrefix(a, "--"); ok {
			name, _, _ = strings.Cut(name, "=")
			if !isFlag(name) {
				bad = append(bad, a)
			}
		}
	}
	return bad
}

func env(c corev1.Container) map[string]corev1.EnvVar {
	out := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		out[e.Name] = e
	}
	return out
}

// secretEnv are the settings whose values may carry passwords: only ever
// from a Secret.
var secretEnv = []string{"PUSHD_REDIS_URL", "PUSHD_REDIS_CACHE_URL", "PUSHD_REDIS_CONTROL_URL",
	"PUSHD_REDIS_REALTIME_URL", "PUSHD_DATABASE_URL"}

// imageUser is the numeric user and group of the Dockerfile's final
// USER (the group is the user's when not given).
func imageUser(t *testing.T) (uid, gid int64) {
	t.Helper()
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	ms := regexp.MustCompile(`(?m)^USER (\d+)(?::(\d+))?\s*$`).FindAllStringSubmatch(string(b), -1)
	if len(ms) == 0 {
		t.Fatal("Dockerfile: no numeric USER")
	}
	m := ms[len(ms)-1]
	uid, _ = strconv.ParseInt(m[1], 10, 64)
	gid = uid
	if m[2] != "" {
		gid, _ = strconv.ParseInt(m[2], 10, 64)
	}
	return uid, gid
}

// checkManifests asserts what every render must hold.
func checkManifests(t *testing.T, m *manifests) {
	t.Helper()
	d := m.deployment
	pod := d.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	e := env(c)

	if len(c.Ports) != 2 || c.Ports[0].Name != "http" || c.Ports[1].Name != "admin" {
		t.Fatalf("container ports %+v, want http, then admin", c.Ports)
	}
	port, adminPort := c.Ports[0], c.Ports[1]
	if got, want := e["PUSHD_LISTEN"].Value, fmt.Sprintf(":%d", port.ContainerPort); got != want {
		t.Errorf("PUSHD_LISTEN %q, want %q (the container port)", got, want)
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"readiness", c.ReadinessProbe, "/readyz"}, {"liveness", c.LivenessProbe, "/healthz"}, {"startup", c.StartupProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s probe %+v, want an HTTP GET", p.name, p.probe)
			continue
		}
		g := p.probe.HTTPGet
		// On the admin port: a herd of clients filling the clients' port's
		// accept queue must not fail a probe.
		onPort := g.Port.StrVal == adminPort.Name || (g.Port.StrVal == "" && g.Port.IntVal == adminPort.ContainerPort)
		if g.Path != p.path || !onPort {
			t.Errorf("%s probe GET %s on port %s, want %s on %s (%d)", p.name, g.Path, g.Port.String(), p.path, adminPort.Name, adminPort.ContainerPort)
		}
	}
	// /readyz asks Redis and PostgreSQL with a 2 s timeout of its own.
	if r := c.ReadinessProbe; r != nil && r.TimeoutSeconds <= 2 {
		t.Errorf("readiness timeout %ds, want above /readyz's own 2s", r.TimeoutSeconds)
	}

	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Exec != nil {
		t.Fatalf("preStop %+v, want the native sleep (the image has no shell)", c.Lifecycle)
	}
	sleep := c.Lifecycle.PreStop.Sleep.Seconds
	drain, err := time.ParseDuration(e["PUSHD_DRAIN_TIMEOUT"].Value)
	if err != nil {
		t.Fatalf("PUSHD_DRAIN_TIMEOUT: %v", err)
	}
	if pod.TerminationGracePeriodSeconds == nil {
		t.Fatal("no terminationGracePeriodSeconds")
	}
	if grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second; grace <= time.Duration(sleep)*time.Second+drain {
		t.Errorf("grace %v, want above preStop %ds + drain %v", grace, sleep, drain)
	}

	if bad := unknownSettings(c); len(bad) > 0 {
		t.Errorf("not settings of pushd (docs/CONFIG.md): %v", bad)
	}

	// Secrets: referenced, never inlined.
	js, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{jwtSentinel, apiSentinel, redisSentinel, "redis-sentinel-pw", "pg-sentinel-pw", "seed-sentinel-pw"} {
		if strings.Contains(string(js), s) {
			t.Errorf("the Deployment inlines a secret value (%.12s...)", s)
		}
	}
	for _, name := range []string{"PUSHD_JWT_SECRET", "PUSHD_API_KEY"} {
		if v, ok := e[name]; ok {
			t.Errorf("%s set (%+v): want its _FILE twin, the Secret mounted", name, v)
		}
	}
	secretName := ""
	for _, name := range secretEnv {
		v, ok := e[name]
		if !ok {
			continue
		}
		if v.Value != "" || v.ValueFrom == nil || v.ValueFrom.SecretKeyRef == nil {
			t.Errorf("%s is not a secretKeyRef: %+v", name, v)
			continue
		}
		ref := v.ValueFrom.SecretKeyRef
		if secretName == "" {
			secretName = ref.Name
		}
		if ref.Name != secretName {
			t.Errorf("%s from Secret %s, others from %s", name, ref.Name, secretName)
		}
		if ref.Optional != nil && *ref.Optional {
			t.Errorf("%s optional: a missing key would start the node without it", name)
		}
		checkSecretHas(t, m, ref.Name, ref.Key)
	}
	if _, ok := e["PUSHD_REDIS_URL"]; !ok {
		t.Error("PUSHD_REDIS_URL unset")
	}
	jwtFile, pubKey := e["PUSHD_JWT_SECRET_FILE"].Value, e["PUSHD_JWT_PUBLIC_KEY"].Value
	if (jwtFile == "") == (pubKey == "") {
		t.Errorf("PUSHD_JWT_SECRET_FILE %q, PUSHD_JWT_PUBLIC_KEY %q: want exactly one", jwtFile, pubKey)
	}
	for _, name := range []string{"PUSHD_JWT_SECRET_FILE", "PUSHD_JWT_PUBLIC_KEY", "PUSHD_API_KEY_FILE"} {
		if v, ok := e[name]; ok {
			checkMountedFromSecret(t, m, c, pod, v.Value, secretName)
		}
	}

	if c.SecurityContext == nil || c.SecurityContext.ReadOnlyRootFilesystem == nil || !*c.SecurityContext.ReadOnlyRootFilesystem {
		t.Errorf("container security context %+v, want a read-only root", c.SecurityContext)
	}
	uid, gid := imageUser(t)
	if sc := pod.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != uid ||
		sc.RunAsGroup == nil || *sc.RunAsGroup != gid || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Errorf("pod security context %+v, want non-root as the image's user %d:%d", sc, uid, gid)
	}

	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := c.Resources.Requests[r]; !ok {
			t.Errorf("no %s request", r)
		}
		if _, ok := c.Resources.Limits[r]; !ok {
			t.Errorf("no %s limit", r)
		}
	}
	if limit, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
		gml, err := resource.ParseQuantity(strings.TrimSuffix(e["GOMEMLIMIT"].Value, "B"))
		if err != nil {
			t.Errorf("GOMEMLIMIT %q: %v", e["GOMEMLIMIT"].Value, err)
		} else if r := float64(gml.Value()) / float64(limit.Value()); r < 0.85 || r > 0.95 {
			t.Errorf("GOMEMLIMIT %s is %.0f%% of the memory limit %s, want about 90%%", e["GOMEMLIMIT"].Value, r*100, limit.String())
		}
	}

	// The Service and the budget select the pods; the Service targets the port.
	podLabels := labels.Set(d.Spec.Template.Labels)
	sel, err := selectorOf(d.Spec.Selector.MatchLabels)
	if err != nil || !sel.Matches(podLabels) {
		t.Errorf("Deployment selector %v does not match its pods %v", d.Spec.Selector, podLabels)
	}
	if !labels.SelectorFromSet(m.service.Spec.Selector).Matches(podLabels) || len(m.service.Spec.Selector) == 0 {
		t.Errorf("Service selector %v does not match the pods %v", m.service.Spec.Selector, podLabels)
	}
	if ps := m.service.Spec.Ports; len(ps) != 1 || ps[0].TargetPort.String() != port.Name || ps[0].Name != "http" {
		t.Errorf("Service ports %+v, want one named http targeting %s", ps, port.Name)
	}
	if pdbSel, err := selectorOf(m.pdb.Spec.Selector.MatchLabels); err != nil || !pdbSel.Matches(podLabels) {
		t.Errorf("PodDisruptionBudget selector %v does not match the pods", m.pdb.Spec.Selector)
	}
	// Metrics are on the admin port only: the container serves it, the
	// clients' Service never carries it, and the ServiceMonitor scrapes it
	// through the admin Service alone.
	admin := containerPort(m, "admin")
	if admin == nil || e["PUSHD_ADMIN_LISTEN"].Value != fmt.Sprintf(":%d", admin.ContainerPort) || admin.ContainerPort == port.ContainerPort {
		t.Errorf("container port admin %+v with PUSHD_ADMIN_LISTEN %q, want the admin listener on a port of its own", admin, e["PUSHD_ADMIN_LISTEN"].Value)
	}
	for _, sm := range m.monitors {
		if m.admin == nil {
			t.Fatal("a ServiceMonitor without the admin Service")
		}
		if ps := m.admin.Spec.Ports; len(ps) != 1 || ps[0].Name != "admin" || ps[0].TargetPort.String() != "admin" || m.admin.Spec.Type != corev1.ServiceTypeClusterIP {
			t.Errorf("admin Service %s ports %+v, want one ClusterIP port admin", m.admin.Spec.Type, ps)
		}
		if !labels.SelectorFromSet(m.admin.Spec.Selector).Matches(podLabels) {
			t.Errorf("admin Service selector %v does not match the pods", m.admin.Spec.Selector)
		}
		smSel, err := selectorOf(sm.Spec.Selector.MatchLabels)
		if err != nil || !smSel.Matches(labels.Set(m.admin.Labels)) || smSel.Matches(labels.Set(m.service.Labels)) {
			t.Errorf("ServiceMonitor selector %v: want it to match the admin Service's labels %v and not the clients' %v", sm.Spec.Selector, m.admin.Labels, m.service.Labels)
		}
		if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "admin" || sm.Spec.Endpoints[0].Path != "/metrics" {
			t.Errorf("ServiceMonitor endpoints %+v, want /metrics on port admin", sm.Spec.Endpoints)
		}
	}
	if m.notes == "" {
		t.Error("NOTES.txt rendered empty")
	}
}

func selectorOf(ml map[string]string) (labels.Selector, error) {
	if len(ml) == 0 {
		return nil, errors.New("empty selector")
	}
	return labels.SelectorFromSet(ml), nil
}

// checkSecretHas asserts that a Secret the chart renders holds key; a
// Secret it does not render is the operator's.
func checkSecretHas(t *testing.T, m *manifests, name, key string) {
	t.Helper()
	for _, s := range m.secrets {
		if s.Name == name {
			if len(s.Data[key]) == 0 {
				t.Errorf("Secret %s has no key %s (keys %v)", name, key, slices.Sorted(maps.Keys(s.Data)))
			}
			return
		}
	}
}

// checkMountedFromSecret asserts that path is a file of a volume mounted
// from the Secret named secret, projected with its key.
func checkMountedFromSecret(t *testing.T, m *manifests, c corev1.Container, pod corev1.PodSpec, path, secret string) {
	t.Helper()
	for _, vm := range c.VolumeMounts {
		rel, err := filepath.Rel(vm.MountPath, path)
		if err != nil || strings.HasPrefix(rel, "..") {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name != vm.Name || v.Secret == nil {
				continue
			}
			if v.Secret.SecretName != secret {
				t.Errorf("%s: from Secret %s, the URLs from %s", path, v.Secret.SecretName, secret)
			}
			for _, it := range v.Secret.Items {
				if it.Path == rel {
					checkSecretHas(t, m, v.Secret.SecretName, it.Key)
					return
				}
			}
			t.Errorf("%s: volume %s does not project %s", path, v.Name, rel)
			return
		}
	}
	t.Errorf("%s: not in a volume mounted from a Secret", path)
}

func container(m *manifests) corev1.Container { return m.deployment.Spec.Template.Spec.Containers[0] }

// containerPort is the container's port of that name, nil if none.
func containerPort(m *manifests, name string) *corev1.ContainerPort {
	for _, p := range container(m).Ports {
		if p.Name == name {
			return &p
		}
	}
	return nil
}

func secretData(t *testing.T, m *manifests, key string) string {
	t.Helper()
	if len(m.secrets) != 1 {
		t.Fatalf("%d Secrets rendered, want the chart's one", len(m.secrets))
	}
	return string(m.secrets[0].Data[key])
}

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

// source is where a connection to a node comes from, for reaches.
type source struct {
	name      string
	namespace string            // empty: outside the cluster
	pod       map[string]string // the connecting pod's labels
}

// namespaceLabels are the labels Kubernetes gives every namespace.
func (s source) namespaceLabels() map[string]string {
	return map[string]string{"kubernetes.io/metadata.name": s.namespace}
}

var sources = []source{
	{"Prometheus in monitoring", "monitoring", map[string]string{"app.kubernetes.io/name": "prometheus"}},
	{"another pod of the release's namespace", "push", map[string]string{"app": "other"}},
	{"a pod in default", "default", map[string]string{"app": "web"}},
	{"the ingress controller", "ingress-nginx", map[string]string{"app.kubernetes.io/name": "ingress-nginx"}},
	{"outside the cluster", "", nil},
}

// reaches reports whether the policies let src open a connection to port
// of m's pods, as a network plugin that enforces them does: a pod no
// policy selects for ingress takes every connection, one that some
// policy selects takes what one of their rules admits. An ipBlock is
// taken to admit every source, which errs towards open.
func reaches(t *testing.T, m *manifests, port int32, src source) bool {
	t.Helper()
	podLabels := labels.Set(m.deployment.Spec.Template.Labels)
	isolated := false
	for _, np := range m.policies {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			t.Fatalf("NetworkPolicy %s podSelector: %v", np.Name, err)
		}
		if !sel.Matches(podLabels) || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			continue
		}
		isolated = true
		for _, rule := range np.Spec.Ingress {
			if portAdmitted(t, m, rule.Ports, port) && peerAdmitted(t, rule.From, src) {
				return true
			}
		}
	}
	return !isolated
}

func portAdmitted(t *testing.T, m *manifests, ports []networkingv1.NetworkPolicyPort, port int32) bool {
	t.Helper()
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		if p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP {
			continue
		}
		switch {
		case p.Port == nil:
			return true
		case p.Port.StrVal != "":
			if cp := containerPort(m, p.Port.StrVal); cp != nil && cp.ContainerPort == port {
				return true
			}
		case p.EndPort != nil:
			if p.Port.IntVal <= port && port <= *p.EndPort {
				return true
			}
		case p.Port.IntVal == port:
			return true
		}
	}
	return false
}

func peerAdmitted(t *testing.T, from []networkingv1.NetworkPolicyPeer, src source) bool {
	t.Helper()
	if len(from) == 0 {
		return true
	}
	for _, peer := range from {
		if peer.IPBlock != nil {
			return true
		}
		if src.namespace == "" { // selectors name pods, never what is outside
			continue
		}
		nsOK := src.namespace == "push" // no namespaceSelector: the policy's own namespace
		if peer.NamespaceSelector != nil {
			sel, err := metav1.LabelSelectorAsSelector(peer.NamespaceSelector)
			if err != nil {
				t.Fatalf("namespaceSelector: %v", err)
			}
			nsOK = sel.Matches(labels.Set(src.namespaceLabels()))
		}
		podOK := true
		if peer.PodSelector != nil {
			sel, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
			if err != nil {
				t.Fatalf("podSelector: %v", err)
			}
			podOK = sel.Matches(labels.Set(src.pod))
		}
		if nsOK && podOK {
			return true
		}
	}
	return false
}

// checkReach asserts who reaches the clients' port, the admin port and a
// port the chart does not open (a --debug-listen added by extraArgs, say):
// the clients' port everyone, the admin port only adminFrom.
func checkReach(t *testing.T, m *manifests, adminFrom ...string) {
	t.Helper()
	httpPort, adminPort := containerPort(m, "http").ContainerPort, containerPort(m, "admin").ContainerPort
	for _, src := range sources {
		if !reaches(t, m, httpPort, src) {
			t.Errorf("%s does not reach the clients' port %d", src.name, httpPort)
		}
		if got, want := reaches(t, m, adminPort, src), slices.Contains(adminFrom, src.name); got != want {
			t.Errorf("%s reaches the admin port %d: %v, want %v", src.name, adminPort, got, want)
		}
		if reaches(t, m, 6060, src) {
			t.Errorf("%s reaches port 6060, which the chart does not open", src.name)
		}
	}
}

// The admin port serves the delivery inspector, which names the users of
// every tenant watching a task: by default a NetworkPolicy lets only the
// monitoring namespace reach it, while the clients' port stays open to
// all; networkPolicy.adminFrom chooses who else, and enabled: false
// renders no policy.
func TestChartNetworkPolicy(t *testing.T) {
	m := render(t, minimalValues())
	if len(m.policies) != 1 {
		t.Fatalf("%d NetworkPolicies by default, want 1", len(m.policies))
	}
	np := m.policies[0]
	if sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector); err != nil || sel.Empty() ||
		!sel.Matches(labels.Set(m.deployment.Spec.Template.Labels)) {
		t.Errorf("NetworkPolicy podSelector %+v does not select the nodes' pods %v alone (%v)", np.Spec.PodSelector, m.deployment.Spec.Template.Labels, err)
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("policyTypes %v, want Ingress only (pushd dials Redis and PostgreSQL)", np.Spec.PolicyTypes)
	}
	checkReach(t, m, "Prometheus in monitoring")
	for _, s := range []string{"NetworkPolicy", "inspector", "host_not_allowed"} {
		if !strings.Contains(m.notes, s) {
			t.Errorf("NOTES.txt lacks %q:\n%s", s, m.notes)
		}
	}

	t.Run("ports follow the values", func(t *testing.T) {
		vals := minimalValues()
		vals["port"], vals["adminPort"] = 9000, 9100
		checkReach(t, render(t, vals), "Prometheus in monitoring")
	})
	t.Run("adminFrom", func(t *testing.T) {
		vals := minimalValues()
		extra, err := chartutil.ReadValues([]byte(`
networkPolicy:
  adminFrom:
    - namespaceSelector:
        matchLabels:
          kubernetes.io/metadata.name: push
      podSelector:
        matchLabels:
          app: other
`))
		if err != nil {
			t.Fatal(err)
		}
		maps.Copy(vals, extra)
		checkReach(t, render(t, vals), "another pod of the release's namespace")
	})
	t.Run("empty adminFrom admits nobody", func(t *testing.T) {
		vals := minimalValues()
		vals["networkPolicy"] = map[string]any{"adminFrom": []any{}}
		m := render(t, vals)
		checkReach(t, m)
		if !strings.Contains(m.notes, "no pod") {
			t.Errorf("NOTES.txt does not say no pod reaches the admin port:\n%s", m.notes)
		}
	})
	t.Run("disabled", func(t *testing.T) {
		vals := minimalValues()
		vals["networkPolicy"] = map[string]any{"enabled": false}
		m := render(t, vals)
		if len(m.policies) != 0 {
			t.Fatalf("%d NetworkPolicies with networkPolicy.enabled false, want none", len(m.policies))
		}
		for _, src := range sources {
			if !reaches(t, m, containerPort(m, "admin").ContainerPort, src) {
				t.Errorf("%s does not reach the admin port with no policy", src.name)
			}
		}
		if !strings.Contains(m.notes, "networkPolicy.enabled is false") {
			t.Errorf("NOTES.txt does not say the admin port is open to every pod:\n%s", m.notes)
		}
	})
}

// TestChartRefusesBadValues: values that would start a broken fleet fail
// the render, naming the value.
func TestChartRefusesBadValues(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(v map[string]any)
		want string
	}{
		{"no redis url", func(v map[string]any) { delete(v["secrets"].(map[string]any), "redisUrl") }, "secrets.redisUrl"},
		{"no jwt secret", func(v map[string]any) { delete(v["secrets"].(map[string]any), "jwtSecret") }, "secrets.jwtSecret"},
		{"admin port on the clients' port", func(v map[string]any) { v["adminPort"] = 8080 }, "adminPort"},
		{"cluster with role URLs", func(v map[string]any) {
			v["redis"] = map[string]any{"mode": "cluster", "separateRoles": []any{"cache"}}
		}, "redis.separateRoles"},
		{"role URL without its role", func(v map[string]any) {
			v["secrets"].(map[string]any)["redisCacheUrl"] = "redis://cache:6379/0"
		}, "secrets.redisCacheUrl"},
		// values.schema.json: a misspelt or mistyped value fails before any
		// template runs, instead of being silently ignored.
		{"unknown role", func(v map[string]any) { v["redis"] = map[string]any{"separateRoles": []any{"pubsub"}} }, "/redis/separateRoles/0"},
		{"redis mode typo", func(v map[string]any) { v["redis"] = map[string]any{"mode": "clustered"} }, "/redis/mode"},
		{"misspelt value", func(v map[string]any) { v["drain"] = map[string]any{"timeoutSecond": 60} }, "'timeoutSecond'"},
		{"misspelt top-level value", func(v map[string]any) { v["replicas"] = 5 }, "'replicas'"},
		{"drain timeout with a unit", func(v map[string]any) { v["drain"] = map[string]any{"timeoutSeconds": "30s"} }, "/drain/timeoutSeconds"},
		{"config sets a managed setting", func(v map[string]any) {
			v["config"] = map[string]any{"drain-timeout": "5s"}
		}, "config.drain-timeout"},
		{"config with a flag's dashes", func(v map[string]any) { v["config"] = map[string]any{"--heartbeat": "5s"} }, "'--heartbeat'"},
		{"existing Secret and values", func(v map[string]any) { v["secrets"].(map[string]any)["existingSecret"] = "mine" }, "existingSecret"},
		{"reading the changes without a database", func(v map[string]any) {
			v["database"] = map[string]any{"enabled": false, "readChanges": true}
			delete(v["secrets"].(map[string]any), "databaseUrl")
		}, "database.readChanges"},
		{"memory limit GOMEMLIMIT cannot follow", func(v map[string]any) {
			v["resources"] = map[string]any{"limits": map[string]any{"memory": "800M"}}
		}, "goMemLimit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals := minimalValues()
			tc.edit(vals)
			_, err := renderChart(chartDir, vals)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("render: %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

// TestUnknownSettingsFlagged: the check TestChart* rely on for the chart's
// variables and flags catches a misspelt one.
func TestUnknownSettingsFlagged(t *testing.T) {
	c := corev1.Container{
		Env:  []corev1.EnvVar{{Name: "PUSHD_HEARTBEAT"}, {Name: "PUSHD_HEARTBEET"}, {Name: "GOMEMLIMIT"}},
		Args: []string{"--write-timeout=5s", "--writ-timeout=5s", "--streams"},
	}
	if got, want := unknownSettings(c), []string{"PUSHD_HEARTBEET", "--writ-timeout=5s"}; !slices.Equal(got, want) {
		t.Errorf("unknownSettings %v, want %v", got, want)
	}
}

// TestChartStrictDecodeCatchesTypos renders copies of the chart with one
// field misspelt: the strict decode must refuse each.
func TestChartStrictDecodeCatchesTypos(t *testing.T) {
	for _, tc := range []struct{ name, file, from, to string }{
		{"grace", "deployment.yaml", "terminationGracePeriodSeconds:", "terminationGracePeriodSecond:"},
		{"case", "deployment.yaml", "readinessProbe:", "ReadinessProbe:"}, // field names are case-sensitive
		{"preStop", "deployment.yaml", "              sleep:\n", "              sleeps:\n"},
		{"targetPort", "service.yaml", "targetPort:", "targetport:"},
		{"pdb", "pdb.yaml", "maxUnavailable:", "maxUnavailble:"},
		{"monitor", "servicemonitor.yaml", "scrapeTimeout:", "scrapeTimout:"},
		{"duplicate", "deployment.yaml", "          env:\n", "          env:\n            - name: PUSHD_LISTEN\n              value: \":8080\"\n          env:\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyChart(t)
			path := filepath.Join(dir, "templates", tc.file)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(b), tc.from) {
				t.Fatalf("%s lacks %q: update the fixture", tc.file, tc.from)
			}
			if err := os.WriteFile(path, []byte(strings.Replace(string(b), tc.from, tc.to, 1)), 0o644); err != nil {
				t.Fatal(err)
			}
			vals := minimalValues()
			vals["serviceMonitor"] = map[string]any{"enabled": true}
			files, err := renderChart(dir, vals)
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			_, err = decodeManifests(files)
			if err == nil || !strings.Contains(err.Error(), "strict decoding error") {
				t.Fatalf("decode: %v, want a strict decoding error", err)
			}
			t.Log(err)
		})
	}
}

// TestChartDecodeRefusesUnknownKinds: an object of a kind the test does
// not check fails rather than passes unchecked.
func TestChartDecodeRefusesUnknownKinds(t *testing.T) {
	dir := copyChart(t)
	cm := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: extra\ndata:\n  a: b\n"
	if err := os.WriteFile(filepath.Join(dir, "templates", "extra.yaml"), []byte(cm), 0o644); err != nil {
		t.Fatal(err)
	}
	files, err := renderChart(dir, minimalValues())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := decodeManifests(files); err == nil || !strings.Contains(err.Error(), "ConfigMap") {
		t.Fatalf("decode: %v, want the ConfigMap refused", err)
	}
}

func copyChart(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pushd")
	if err := os.CopyFS(dir, os.DirFS(chartDir)); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestChartLint runs helm lint --strict's checks, and the Kubernetes range
// the chart claims.
func TestChartLint(t *testing.T) {
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	l := lint.AllWithKubeVersion(chartDir, minimalValues(), "push", kv)
	for _, msg := range l.Messages {
		if msg.Severity >= support.WarningSev {
			t.Errorf("lint: %v", msg)
		} else {
			t.Logf("lint: %v", msg)
		}
	}
	ch, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	// preStop.sleep is beta and on by default from 1.30; on 1.29 the field
	// would be dropped or refused.
	if !chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, kubeVersion) || chartutil.IsCompatibleRange(ch.Metadata.KubeVersion, "v1.29.9") {
		t.Errorf("Chart.yaml kubeVersion %q: want 1.30 and later only", ch.Metadata.KubeVersion)
	}
}
