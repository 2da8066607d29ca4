package chart

import (
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestMetricsCertificate: with metrics.certSecret the manager serves that
// Secret's certificate (--metrics-cert-dir on its mount) and the
// ServiceMonitor verifies it against the Secret's ca.crt for the Service's
// name; without it, or with plain HTTP, neither is there and the scrape
// skips verification of the self-signed certificate as before.
func TestMetricsCertificate(t *testing.T) {
	const arg = "--metrics-cert-dir=/etc/flashsale/metrics-tls"
	objs := render(t, "monitoring.serviceMonitor.enabled=true", "metrics.certSecret=metrics-tls")
	d, _ := manager(t, objs)
	c := d.Spec.Template.Spec.Containers[0]
	if !slices.Contains(c.Args, arg) {
		t.Errorf("args %v, want %s", c.Args, arg)
	}
	vols := d.Spec.Template.Spec.Volumes
	if len(vols) != 1 || vols[0].Secret == nil || vols[0].Secret.SecretName != "metrics-tls" ||
		len(c.VolumeMounts) != 1 || c.VolumeMounts[0].Name != vols[0].Name || c.VolumeMounts[0].MountPath != "/etc/flashsale/metrics-tls" || !c.VolumeMounts[0].ReadOnly {
		t.Errorf("volumes %+v, mounts %+v", vols, c.VolumeMounts)
	}
	tlsConfig := endpointTLS(t, objs)
	ca, _, _ := unstructured.NestedStringMap(tlsConfig, "ca", "secret")
	if ca["name"] != "metrics-tls" || ca["key"] != "ca.crt" || tlsConfig["serverName"] != "fs-flashsale-operator-metrics.flashsale-system.svc" || tlsConfig["insecureSkipVerify"] != nil {
		t.Errorf("ServiceMonitor tlsConfig %v", tlsConfig)
	}

	for _, set := range [][]string{
		{"monitoring.serviceMonitor.enabled=true"},
		{"monitoring.serviceMonitor.enabled=true", "metrics.certSecret=metrics-tls", "metrics.secure=false"},
	} {
		objs := render(t, set...)
		d, _ := manager(t, objs)
		if c := d.Spec.Template.Spec.Containers[0]; slices.Contains(c.Args, arg) || len(d.Spec.Template.Spec.Volumes) != 0 || len(c.VolumeMounts) != 0 {
			t.Errorf("%v: args %v, volumes %+v", set, c.Args, d.Spec.Template.Spec.Volumes)
		}
		if set[len(set)-1] == "metrics.secure=false" {
			continue // plain HTTP: no tlsConfig
		}
		if tlsConfig := endpointTLS(t, objs); tlsConfig["insecureSkipVerify"] != true {
			t.Errorf("%v: tlsConfig %v, want insecureSkipVerify", set, tlsConfig)
		}
	}
}

// endpointTLS is the tlsConfig of the manager's ServiceMonitor endpoint.
func endpointTLS(t *testing.T, objs []*unstructured.Unstructured) map[string]any {
	t.Helper()
	sm := find(t, objs, "ServiceMonitor", "-manager")
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(eps) != 1 {
		t.Fatalf("ServiceMonitor endpoints %v", eps)
	}
	cfg, _, _ := unstructured.NestedMap(eps[0].(map[string]any), "tlsConfig")
	return cfg
}
