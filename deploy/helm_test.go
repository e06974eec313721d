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
