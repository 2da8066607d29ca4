/*
Copyright 2026 The flashsale-operator Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package v1alpha1_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	crdvalidation "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"

	"github.com/flashsale-dev/flashsale-operator/api/v1alpha1"
)

// crdPath is the generated CRD, relative to this package.
var crdPath = filepath.Join("..", "..", "config", "crd", "bases", "flashsale.dev_flashsales.yaml")

func loadCRD(t *testing.T) *apiextensionsv1.CustomResourceDefinition {
	t.Helper()
	data, err := os.ReadFile(crdPath)
	if err != nil {
		t.Fatalf("reading the generated CRD (run `make manifests`): %v", err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(data, crd); err != nil {
		t.Fatalf("parsing %s: %v", crdPath, err)
	}
	return crd
}

func servedVersion(t *testing.T, crd *apiextensionsv1.CustomResourceDefinition) *apiextensionsv1.CustomResourceDefinitionVersion {
	t.Helper()
	if len(crd.Spec.Versions) != 1 {
		t.Fatalf("want exactly one version, got %d", len(crd.Spec.Versions))
	}
	v := &crd.Spec.Versions[0]
	if v.Name != v1alpha1.GroupVersion.Version || !v.Served || !v.Storage {
		t.Fatalf("version %q served=%v storage=%v, want %s served and stored", v.Name, v.Served, v.Storage, v1alpha1.GroupVersion.Version)
	}
	return v
}

func TestCRDNamesAndSubresources(t *testing.T) {
	crd := loadCRD(t)
	if crd.Name != "flashsales.flashsale.dev" || crd.Spec.Group != v1alpha1.GroupVersion.Group {
		t.Errorf("name %q group %q, want flashsales.flashsale.dev in group %s", crd.Name, crd.Spec.Group, v1alpha1.GroupVersion.Group)
	}
	if crd.Spec.Scope != apiextensionsv1.NamespaceScoped {
		t.Errorf("scope %q, want Namespaced", crd.Spec.Scope)
	}
	n := crd.Spec.Names
	if n.Kind != "FlashSale" || n.ListKind != "FlashSaleList" || n.Plural != "flashsales" || n.Singular != "flashsale" {
		t.Errorf("names %+v", n)
	}
	if len(n.ShortNames) != 1 || n.ShortNames[0] != "fs" {
		t.Errorf("short names %v, want [fs]", n.ShortNames)
	}
	v := servedVersion(t, crd)
	if v.Subresources == nil || v.Subresources.Status == nil {
		t.Errorf("status subresource missing")
	}
}

func TestCRDPrinterColumns(t *testing.T) {
	v := servedVersion(t, loadCRD(t))
	want := []struct {
		name, typ, path string
		priority        int32 // 1: only with -o wide
	}{
		{"SKU", "string", ".spec.sku", 0},
		{"Phase", "string", ".status.phase", 0},
		// During an incident the phase may still say Open: Admitting says
		// whether reservations are actually taken, Reason why the sale is not Ready.
		{"Admitting", "string", `.status.conditions[?(@.type=="Admitting")].status`, 0},
		// The allocation in effect, which Available, Reserved and Sold add up
		// to; a refused or pending change shows in the AllocationApplied condition.
		{"Allocation", "integer", ".status.allocation", 0},
		{"Available", "integer", ".status.available", 0},
		{"Reserved", "integer", ".status.reserved", 0},
		{"Sold", "integer", ".status.sold", 0},
		// Ready in the default view: pods crash-looping or a sweeper down
		// leave the phase Open and Admitting True.
		{"Ready", "string", `.status.conditions[?(@.type=="Ready")].status`, 0},
		// A replica crash-looping while the others serve: Ready stays True.
		{"Degraded", "string", `.status.conditions[?(@.type=="Degraded")].status`, 0},
		{"Reason", "string", `.status.conditions[?(@.type=="Ready")].reason`, 1},
		// The schedule as written: a date column prints a time ahead as <invalid>.
		{"Start", "string", ".spec.schedule.start", 1},
		{"End", "string", ".spec.schedule.end", 1},
		// How old the counts are: more than a minute is stale.
		{"Counted", "date", ".status.countsObservedAt", 1},
		{"Age", "date", ".metadata.creationTimestamp", 0},
	}
	got := v.AdditionalPrinterColumns
	if len(got) != len(want) {
		t.Fatalf("got %d printer columns, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		if got[i].Name != w.name || got[i].Type != w.typ || got[i].JSONPath != w.path || got[i].Priority != w.priority {
			t.Errorf("column %d: got %s/%s/%s/%d, want %s/%s/%s/%d", i, got[i].Name, got[i].Type, got[i].JSONPath, got[i].Priority, w.name, w.typ, w.path, w.priority)
		}
	}
}

// TestCRDValidationRules checks that each CEL rule sits on the field it
// guards, so that a regenerated CRD cannot silently lose one.
func TestCRDValidationRules(t *testing.T) {
	spec := servedVersion(t, loadCRD(t)).Schema.OpenAPIV3Schema.Properties["spec"]
	want := []struct {
		path    []string
		rule    string
		message string
	}{
		{[]string{"sku"}, "self == oldSelf", "sku is immutable"},
		{[]string{"shards"}, "self == oldSelf", "shards is immutable"},
		{[]string{"schedule"}, "self.end > self.start", "schedule.end must be after schedule.start"},
		{[]string{"reservation", "ttl"}, "duration(self) >= duration('1s')", "reservation.ttl must be at least 1s"},
		{[]string{"reservation", "gracePeriod"}, "duration(self) >= duration('0s')", "reservation.gracePeriod must not be negative"},
		{[]string{"sweeper", "interval"}, "duration(self) >= duration('1s')", "sweeper.interval must be at least 1s"},
		{[]string{"reservation", "ttl"}, "duration(self) <= duration('24h')", "reservation.ttl must be at most 24h"},
		{[]string{"reservation", "gracePeriod"}, "duration(self) <= duration('1h')", "reservation.gracePeriod must be at most 1h"},
		{[]string{"sweeper", "interval"}, "duration(self) <= duration('1h')", "sweeper.interval must be at most 1h"},
		{[]string{"reservation", "requestTimeout"}, "duration(self) >= duration('100ms')", "reservation.requestTimeout must be at least 100ms"},
		{[]string{"reservation", "requestTimeout"}, "duration(self) <= duration('10s')", "reservation.requestTimeout must be at most 10s"},
	}
	for _, w := range want {
		s := spec
		for _, p := range w.path {
			var ok bool
			if s, ok = s.Properties[p]; !ok {
				t.Fatalf("spec.%s missing from the schema", strings.Join(w.path, "."))
			}
		}
		found := false
		for _, r := range s.XValidations {
			if strings.Contains(r.Rule, w.rule) && strings.Contains(r.Message, w.message) {
				found = true
			}
		}
		if !found {
			t.Errorf("spec.%s: no rule %q with message %q; have %+v", strings.Join(w.path, "."), w.rule, w.message, s.XValidations)
		}
	}
}

// TestCRDIsValid runs the API server's own CRD validation, which compiles
// every CEL rule and checks its estimated cost.
func TestCRDIsValid(t *testing.T) {
	crd := loadCRD(t)
	apiextensionsv1.SetObjectDefaults_CustomResourceDefinition(crd)
	internal := &apiextensions.CustomResourceDefinition{}
	if err := apiextensionsv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(crd, internal, nil); err != nil {
		t.Fatal(err)
	}
	if errs := crdvalidation.ValidateCustomResourceDefinition(context.Background(), internal); len(errs) > 0 {
		t.Fatalf("the API server would refuse the CRD:\n%v", errs.ToAggregate())
	}
}

// admission runs a FlashSale through the API server's schema machinery for
// custom resources: defaulting, OpenAPI validation and CEL rules. The
// envtest suite does the same against a real API server.
type admission struct {
	structural *structuralschema.Structural
	schema     apiservervalidation.SchemaValidator
	cel        *cel.Validator
}

func newAdmission(t *testing.T) *admission {
	t.Helper()
	v := servedVersion(t, loadCRD(t))
	internal := &apiextensions.JSONSchemaProps{}
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(v.Schema.OpenAPIV3Schema, internal, nil); err != nil {
		t.Fatal(err)
	}
	ss, err := structuralschema.NewStructural(internal)
	if err != nil {
		t.Fatalf("the schema is not structural: %v", err)
	}
	sv, _, err := apiservervalidation.NewSchemaValidator(internal)
	if err != nil {
		t.Fatal(err)
	}
	return &admission{structural: ss, schema: sv, cel: cel.NewValidator(ss, true, celconfig.PerCallLimit)}
}

// admit defaults obj in place and validates it, as an update of old when old
// is not nil.
func (a *admission) admit(obj, old map[string]any) field.ErrorList {
	structuraldefaulting.Default(obj, a.structural)
	var errs field.ErrorList
	if old == nil {
		errs = apiservervalidation.ValidateCustomResource(nil, obj, a.schema)
	} else {
		errs = apiservervalidation.ValidateCustomResourceUpdate(nil, obj, old, a.schema)
	}
	celErrs, _ := a.cel.Validate(context.Background(), nil, a.structural, obj, old, celconfig.RuntimeCELCostBudget)
	return append(errs, celErrs...)
}

// minimal is the smallest valid FlashSale: everything else is defaulted.
func minimal() map[string]any {
	return map[string]any{
		"apiVersion": "flashsale.dev/v1alpha1",
		"kind":       "FlashSale",
		"metadata":   map[string]any{"name": "ps5-drop", "namespace": "shop"},
		"spec": map[string]any{
			"sku":        "itm-ps5-pro",
			"allocation": int64(1000),
			"redis":      map[string]any{"secretRef": map[string]any{"name": "shop-redis"}},
			"postgres":   map[string]any{"secretRef": map[string]any{"name": "shop-ledger"}},
			"admission":  map[string]any{"secretRef": map[string]any{"name": "waiting-room"}},
		},
	}
}

// with returns minimal() with the value at path (under spec) set, or removed
// when value is nil.
func with(value any, path ...string) map[string]any {
	obj := minimal()
	fields := append([]string{"spec"}, path...)
	if value == nil {
		unstructured.RemoveNestedField(obj, fields...)
	} else if err := unstructured.SetNestedField(obj, value, fields...); err != nil {
		panic(err)
	}
	return obj
}

// tolerations returns minimal() with these spec.pods.tolerations.
func tolerations(ts ...map[string]any) map[string]any {
	list := make([]any, len(ts))
	for i, t := range ts {
		list[i] = t
	}
	return with(list, "pods", "tolerations")
}

func TestMinimalFlashSaleIsDefaulted(t *testing.T) {
	a := newAdmission(t)
	obj := minimal()
	if errs := a.admit(obj, nil); len(errs) > 0 {
		t.Fatalf("minimal FlashSale rejected: %v", errs.ToAggregate())
	}
	want := map[string]any{
		"shards":                     int64(v1alpha1.DefaultShards),
		"maxPerUser":                 int64(v1alpha1.DefaultMaxPerUser),
		"reservation.ttl":            v1alpha1.DefaultReservationTTL,
		"reservation.gracePeriod":    v1alpha1.DefaultReservationGrace,
		"reservation.stealProbes":    int64(v1alpha1.DefaultStealProbes),
		"reservation.replicas":       int64(v1alpha1.DefaultReservationReplicas),
		"reservation.requestTimeout": v1alpha1.DefaultRequestTimeout,
		"reservation.maxInFlight":    int64(v1alpha1.DefaultMaxInFlight),
		"sweeper.interval":           v1alpha1.DefaultSweeperInterval,
		"redis.mode":                 string(v1alpha1.DefaultRedisMode),
		"postgres.secretRef.key":     v1alpha1.DefaultPostgresSecretKey,
		"admission.secretRef.key":    v1alpha1.DefaultAdmissionSecretKey,
		"redis.secretRef.name":       "shop-redis",
		"postgres.secretRef.name":    "shop-ledger",
		"admission.secretRef.name":   "waiting-room",
	}
	for path, w := range want {
		got, found, err := unstructured.NestedFieldNoCopy(obj, append([]string{"spec"}, strings.Split(path, ".")...)...)
		if err != nil || !found {
			t.Errorf("spec.%s not defaulted (err %v)", path, err)
			continue
		}
		if got != w {
			t.Errorf("spec.%s = %v (%T), want %v (%T)", path, got, got, w, w)
		}
	}
}

func TestInvalidFlashSalesAreRejected(t *testing.T) {
	a := newAdmission(t)
	tests := []struct {
		name string
		old  map[string]any // nil for a create
		obj  map[string]any
		want string // substring of the error
	}{
		{"end before start", nil,
			with(map[string]any{"start": "2026-12-01T10:00:00Z", "end": "2026-12-01T09:00:00Z"}, "schedule"),
			"schedule.end must be after schedule.start"},
		{"end equal to start", nil,
			with(map[string]any{"start": "2026-12-01T09:00:00Z", "end": "2026-12-01T09:00:00Z"}, "schedule"),
			"schedule.end must be after schedule.start"},
		{"start not a time", nil,
			with(map[string]any{"start": "tomorrow"}, "schedule"),
			"spec.schedule.start"},
		// Forms the API server's date-time check takes and the operator
		// cannot read.
		{"start with a lowercase t and z", nil,
			with(map[string]any{"start": "2026-12-01t09:00:00z"}, "schedule"),
			"spec.schedule.start in body should match"},
		{"end with an offset of 25 hours", nil,
			with(map[string]any{"end": "2026-12-01T09:00:00+25:00"}, "schedule"),
			"spec.schedule.end in body should match"},
		{"end with a space for T", nil,
			with(map[string]any{"end": "2026-12-01 09:00:00Z"}, "schedule"),
			"spec.schedule.end"},
		{"zero shards", nil, with(int64(0), "shards"),
			"spec.shards in body should be greater than or equal to 1"},
		{"too many shards", nil, with(int64(1025), "shards"),
			"spec.shards in body should be less than or equal to 1024"},
		{"negative allocation", nil, with(int64(-1), "allocation"),
			"spec.allocation in body should be greater than or equal to 0"},
		{"allocation above ten million", nil, with(int64(10_000_001), "allocation"),
			"allocation is at most 10000000"},
		{"sku changed", minimal(), with("itm-xbox", "sku"),
			"sku is immutable"},
		{"shards changed", minimal(), with(int64(12), "shards"),
			"shards is immutable"},
		{"three steal probes", nil, with(int64(3), "reservation", "stealProbes"),
			"spec.reservation.stealProbes in body should be less than or equal to 2"},
		{"zero maxPerUser", nil, with(int64(0), "maxPerUser"),
			"spec.maxPerUser in body should be greater than or equal to 1"},
		{"unknown redis mode", nil, with("sentinel", "redis", "mode"),
			`spec.redis.mode: Unsupported value: "sentinel"`},
		{"zero ttl", nil, with("0s", "reservation", "ttl"),
			"reservation.ttl must be at least 1s"},
		{"sub-millisecond ttl", nil, with("500us", "reservation", "ttl"),
			"reservation.ttl must be at least 1s"},
		{"ttl not a duration", nil, with("ten minutes", "reservation", "ttl"),
			"spec.reservation.ttl in body should match"},
		{"negative grace period", nil, with("-1s", "reservation", "gracePeriod"),
			"spec.reservation.gracePeriod in body should match"},
		{"zero sweeper interval", nil, with("0s", "sweeper", "interval"),
			"sweeper.interval must be at least 1s"},
		{"nanosecond sweeper interval", nil, with("1ns", "sweeper", "interval"),
			"sweeper.interval must be at least 1s"},
		// TTL plus grace past int64 nanoseconds (292 years) wrapped around:
		// claims reaped at once, reservation hashes dropped while held.
		{"ttl of centuries", nil, with("2562047h", "reservation", "ttl"),
			"reservation.ttl must be at most 24h"},
		{"ttl over a day", nil, with("24h1s", "reservation", "ttl"),
			"reservation.ttl must be at most 24h"},
		{"grace period over an hour", nil, with("61m", "reservation", "gracePeriod"),
			"reservation.gracePeriod must be at most 1h"},
		{"sweeper interval over an hour", nil, with("2h", "sweeper", "interval"),
			"sweeper.interval must be at most 1h"},
		{"request timeout under 100ms", nil, with("99ms", "reservation", "requestTimeout"),
			"reservation.requestTimeout must be at least 100ms"},
		{"request timeout past 10s", nil, with("10001ms", "reservation", "requestTimeout"),
			"reservation.requestTimeout must be at most 10s"},
		{"request timeout not a duration", nil, with("5", "reservation", "requestTimeout"),
			"spec.reservation.requestTimeout in body should match"},
		{"zero maxInFlight", nil, with(int64(0), "reservation", "maxInFlight"),
			"spec.reservation.maxInFlight in body should be greater than or equal to 1"},
		{"maxInFlight past a million", nil, with(int64(1_000_001), "reservation", "maxInFlight"),
			"spec.reservation.maxInFlight in body should be less than or equal to 1000000"},
		{"reserve replicas past 10000", nil, with(int64(10001), "reservation", "replicas"),
			"spec.reservation.replicas in body should be less than or equal to 10000"},
		{"missing sku", nil, with(nil, "sku"),
			"spec.sku: Required value"},
		{"empty sku", nil, with("", "sku"),
			"spec.sku in body should be at least 1 chars long"},
		{"missing redis", nil, with(nil, "redis"),
			"spec.redis: Required value"},
		{"missing ledger secret name", nil, with(nil, "postgres", "secretRef", "name"),
			"spec.postgres.secretRef.name: Required value"},
		{"secret name with a percent sign", nil, with("redis%2f", "redis", "secretRef", "name"),
			"spec.redis.secretRef.name in body should match"},
		// Keys the pattern takes and no Secret can hold.
		{"ledger key '.'", nil, with(".", "postgres", "secretRef", "key"),
			"postgres.secretRef.key must not be '.' or start with '..'"},
		{"ledger key '..'", nil, with("..", "postgres", "secretRef", "key"),
			"postgres.secretRef.key must not be '.' or start with '..'"},
		{"admission key starting with '..'", nil, with("..hmac", "admission", "secretRef", "key"),
			"admission.secretRef.key must not be '.' or start with '..'"},
		// "<key>.previous" must fit a Secret key's 253 characters.
		{"admission key of 245 characters", nil, with(strings.Repeat("k", 245), "admission", "secretRef", "key"),
			"spec.admission.secretRef.key: Too long"},
		{"negative replicas", nil, with(int64(-1), "reservation", "replicas"),
			"spec.reservation.replicas in body should be greater than or equal to 0"},
		{"unknown toleration operator", nil, tolerations(map[string]any{"key": "drop", "operator": "In"}),
			"pods.tolerations[].operator must be Equal, Exists, Lt or Gt"},
		{"unknown taint effect", nil, tolerations(map[string]any{"key": "drop", "effect": "NoScheduleNoAdmit"}),
			"pods.tolerations[].effect must be NoSchedule, PreferNoSchedule or NoExecute"},
		{"toleration without key or Exists", nil, tolerations(map[string]any{"value": "x"}),
			"a toleration without a key must have operator Exists"},
		{"Exists with a value", nil, tolerations(map[string]any{"key": "drop", "operator": "Exists", "value": "yes"}),
			"operator Exists takes no value"},
		{"tolerationSeconds without NoExecute", nil, tolerations(map[string]any{"key": "drop", "effect": "NoSchedule", "tolerationSeconds": int64(30)}),
			"tolerationSeconds needs effect NoExecute"},
		{"nodeSelector key not a label key", nil, with(map[string]any{"drop/pool/x": "a"}, "pods", "nodeSelector"),
			"pods.nodeSelector keys must be label keys"},
		{"priorityClassName in capitals", nil, with("Drop-Critical", "pods", "priorityClassName"),
			"pods.priorityClassName must be a PriorityClass name"},
		// What the Deployment's write would refuse, after the sale was taken.
		{"reserve memory request above its limit", nil, with(map[string]any{
			"requests": map[string]any{"memory": "512Mi"}, "limits": map[string]any{"memory": "256Mi"}}, "reservation", "resources"),
			"reservation.resources.requests.memory must be at most limits.memory"},
		{"reserve cpu request above its limit, in other units", nil, with(map[string]any{
			"requests": map[string]any{"cpu": int64(2)}, "limits": map[string]any{"cpu": "1500m"}}, "reservation", "resources"),
			"reservation.resources.requests.cpu must be at most limits.cpu"},
		{"negative sweeper cpu", nil, with(map[string]any{"requests": map[string]any{"cpu": "-100m"}}, "sweeper", "resources"),
			"sweeper.resources.requests.cpu must not be negative"},
		{"negative reserve memory limit", nil, with(map[string]any{"limits": map[string]any{"memory": "-1Gi"}}, "reservation", "resources"),
			"reservation.resources.limits.memory must not be negative"},
		{"resource claims", nil, with(map[string]any{"claims": []any{map[string]any{"name": "gpu"}}}, "sweeper", "resources"),
			"sweeper.resources.claims: the pods have no resource claims to use"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.old != nil {
				if errs := a.admit(tt.old, nil); len(errs) > 0 {
					t.Fatalf("old object rejected: %v", errs.ToAggregate())
				}
			}
			errs := a.admit(tt.obj, tt.old)
			if len(errs) == 0 {
				t.Fatalf("accepted, want an error containing %q", tt.want)
			}
			if msg := errs.ToAggregate().Error(); !strings.Contains(msg, tt.want) {
				t.Errorf("error %q does not contain %q", msg, tt.want)
			}
		})
	}
}

func TestValidUpdatesAreAccepted(t *testing.T) {
	a := newAdmission(t)
	old := minimal()
	if errs := a.admit(old, nil); len(errs) > 0 {
		t.Fatal(errs.ToAggregate())
	}
	for name, obj := range map[string]map[string]any{
		"restock":                  with(int64(2000), "allocation"),
		"ten million":              with(int64(10_000_000), "allocation"),
		"pause":                    with(true, "paused"),
		"longer ttl":               with("15m", "reservation", "ttl"),
		"zero grace":               with("0s", "reservation", "gracePeriod"),
		"a day's ttl":              with("24h", "reservation", "ttl"),
		"an hour's grace":          with("1h", "reservation", "gracePeriod"),
		"hourly sweeps":            with("60m", "sweeper", "interval"),
		"no steal probes":          with(int64(0), "reservation", "stealProbes"),
		"shortest request timeout": with("100ms", "reservation", "requestTimeout"),
		"longest request timeout":  with("10s", "reservation", "requestTimeout"),
		"one in flight":            with(int64(1), "reservation", "maxInFlight"),
		"a million in flight":      with(int64(1_000_000), "reservation", "maxInFlight"),
		"cluster mode":             with("cluster", "redis", "mode"),
		"a ledger key with dots":   with(".dsn..v2", "postgres", "secretRef", "key"),
		"an admission key of 244":  with(strings.Repeat("k", 244), "admission", "secretRef", "key"),
		"open-ended start":         with(map[string]any{"start": "2026-12-01T09:00:00Z"}, "schedule"),
		"offset and fraction": with(map[string]any{
			"start": "2026-12-01T09:00:00.250+01:00", "end": "2026-12-01T10:00:00-05:30"}, "schedule"),
		"tolerations": tolerations(
			map[string]any{"key": "dedicated", "operator": "Equal", "value": "drop", "effect": "NoSchedule"},
			map[string]any{"key": "example.com/drop", "value": "yes"},
			map[string]any{"operator": "Exists"},
			map[string]any{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": int64(30)},
			map[string]any{"key": "capacity", "operator": "Gt", "value": "10"},
			// Empty strings, as a pod takes them: Equal, and every effect.
			map[string]any{"key": "pool", "operator": "", "value": "drop", "effect": ""}),
		"no priority class": with(map[string]any{"priorityClassName": ""}, "pods"),
		"placement": with(map[string]any{
			"nodeSelector":      map[string]any{"pool": "drop", "example.com/zone": "", "tier": "a_b.c-1"},
			"priorityClassName": "drop-critical.v2",
		}, "pods"),
		"window": with(map[string]any{
			"start": "2026-12-01T09:00:00Z", "end": "2026-12-01T09:00:01Z"}, "schedule"),
		"reserve resources": with(map[string]any{
			"requests": map[string]any{"cpu": "500m", "memory": "256Mi", "ephemeral-storage": "1Gi"},
			"limits":   map[string]any{"cpu": int64(1), "memory": "0.25Gi"}}, "reservation", "resources"),
		"sweeper limits only": with(map[string]any{"limits": map[string]any{"cpu": "100m", "memory": "64Mi"}}, "sweeper", "resources"),
	} {
		if errs := a.admit(obj, old); len(errs) > 0 {
			t.Errorf("%s rejected: %v", name, errs.ToAggregate())
		}
	}
}

// TestSamplesAreValid admits every FlashSale in config/samples and checks
// that the samples' kustomization lists every sample file.
func TestSamplesAreValid(t *testing.T) {
	a := newAdmission(t)
	dir := filepath.Join("..", "..", "config", "samples")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var kustomization struct {
		Resources []string `json:"resources"`
	}
	listed := map[string]bool{}
	flashSales := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(f) == "kustomization.yaml" {
			if err := yaml.Unmarshal(data, &kustomization); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			for _, r := range kustomization.Resources {
				listed[r] = true
			}
			continue
		}
		// Decode as the API server does: integers as int64, not float64.
		js, err := yaml.YAMLToJSON(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		obj := map[string]any{}
		if err := utiljson.Unmarshal(js, &obj); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if obj["kind"] != "FlashSale" {
			continue
		}
		flashSales++
		typed := &v1alpha1.FlashSale{}
		if err := yaml.UnmarshalStrict(data, typed); err != nil {
			t.Errorf("%s does not decode into a FlashSale: %v", f, err)
		}
		if errs := a.admit(obj, nil); len(errs) > 0 {
			t.Errorf("%s is rejected: %v", f, errs.ToAggregate())
		}
	}
	if flashSales < 2 {
		t.Errorf("found %d sample FlashSales, want the ps5-drop and the scheduled drop", flashSales)
	}
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" && !listed[b] {
			t.Errorf("%s is missing from config/samples/kustomization.yaml", b)
		}
	}
}
