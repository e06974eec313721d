package deploy_test

// The chart's NetworkPolicy, evaluated as a network plugin would: who
// reaches each of a node's ports.

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

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
