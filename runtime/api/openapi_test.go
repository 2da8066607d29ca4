package api

import (
	"bytes"
	"encoding/json"
	"go/ast"
	"go/token"
	"mime"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/flashsale-dev/flashsale-operator/internal/testharness"
)

const openAPIPath = "../../docs/openapi.yaml"

// The parts of an OpenAPI 3 document this test reads.
type (
	openAPIDoc struct {
		OpenAPI    string                          `json:"openapi"`
		Paths      map[string]map[string]operation `json:"paths"`
		Components struct {
			Schemas   map[string]schema     `json:"schemas"`
			Responses map[string]oaResponse `json:"responses"`
		} `json:"components"`
	}
	operation struct {
		OperationID string                `json:"operationId"`
		Security    []map[string][]string `json:"security"`
		Parameters  []struct {
			Name    string `json:"name"`
			In      string `json:"in"`
			Example string `json:"example"`
		} `json:"parameters"`
		RequestBody *struct {
			Content map[string]struct {
				Example json.RawMessage `json:"example"`
			} `json:"content"`
		} `json:"requestBody"`
		Responses map[string]oaResponse `json:"responses"`
	}
	oaResponse struct {
		Ref     string `json:"$ref"`
		Content map[string]struct {
			Schema schema `json:"schema"`
		} `json:"content"`
		Headers map[string]any `json:"headers"`
	}
	schema struct {
		Ref      string            `json:"$ref"`
		Required []string          `json:"required"`
		Enum     []string          `json:"enum"`
		Props    map[string]schema `json:"properties"`
	}
)

func loadOpenAPI(t *testing.T) openAPIDoc {
	t.Helper()
	y, err := os.ReadFile(openAPIPath)
	if err != nil {
		t.Fatal(err)
	}
	js, err := yaml.YAMLToJSON(y)
	if err != nil {
		t.Fatalf("%s: %v", openAPIPath, err)
	}
	var doc openAPIDoc
	if err := json.Unmarshal(js, &doc); err != nil {
		t.Fatalf("%s: %v", openAPIPath, err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.0") || len(doc.Paths) == 0 {
		t.Fatalf("%s is not an OpenAPI 3.0 document with paths", openAPIPath)
	}
	return doc
}

func (d openAPIDoc) response(t *testing.T, r oaResponse) oaResponse {
	t.Helper()
	if r.Ref == "" {
		return r
	}
	name, ok := strings.CutPrefix(r.Ref, "#/components/responses/")
	res, found := d.Components.Responses[name]
	if !ok || !found {
		t.Fatalf("dangling $ref %s", r.Ref)
	}
	return res
}

func (d openAPIDoc) schema(t *testing.T, s schema) schema {
	t.Helper()
	if s.Ref == "" {
		return s
	}
	name, ok := strings.CutPrefix(s.Ref, "#/components/schemas/")
	res, found := d.Components.Schemas[name]
	if !ok || !found {
		t.Fatalf("dangling $ref %s", s.Ref)
	}
	return res
}

// TestOpenAPIMatchesRoutes holds docs/openapi.yaml against the server: every
// registered route is documented, every documented operation is routed to its
// handler, and each operation's example request, sent to a real server, gets a
// documented status with the documented headers, content type, required fields
// and codes; so does a method the path does not serve (405).
func TestOpenAPIMatchesRoutes(t *testing.T) {
	doc := loadOpenAPI(t)
	f := newFixture(t, withAllocation(10), withShards(4))

	registered := map[string]bool{}
	for _, rt := range f.srv.Routes() {
		key := rt.Method + " " + rt.Pattern
		registered[key] = true
		if _, ok := doc.Paths[rt.Pattern][strings.ToLower(rt.Method)]; !ok {
			t.Errorf("route %s is not documented in %s", key, openAPIPath)
		}
	}

	var ops []string
	for path, methods := range doc.Paths {
		for method := range methods {
			ops = append(ops, strings.ToUpper(method)+" "+path)
		}
	}
	sort.Strings(ops)
	for _, key := range ops {
		method, path, _ := strings.Cut(key, " ")
		op := doc.Paths[path][strings.ToLower(method)]
		t.Run(op.OperationID, func(t *testing.T) {
			if !registered[key] {
				t.Fatalf("%s is documented but not registered", key)
			}
			// Fill the path parameters from their examples.
			url := path
			for _, p := range op.Parameters {
				if p.In == "path" {
					if p.Example == "" {
						t.Fatalf("path parameter %s has no example", p.Name)
					}
					url = strings.ReplaceAll(url, "{"+p.Name+"}", p.Example)
				}
			}
			if strings.Contains(url, "{") {
				t.Fatalf("%s: a path parameter is not declared", path)
			}
			var body []byte
			if op.RequestBody != nil {
				body = op.RequestBody.Content["application/json"].Example
				if len(body) == 0 {
					t.Fatal("the request body has no application/json example")
				}
			}
			req := httptest.NewRequest(method, url, bytes.NewReader(body))
			if _, pattern := f.srv.mux.Handler(req); pattern != key {
				t.Fatalf("%s %s is routed to %q, not %q", method, url, pattern, key)
			}

			token := ""
			if len(op.Security) > 0 {
				user := "u-123"
				var ex map[string]any
				if json.Unmarshal(body, &ex) == nil && ex["user_id"] != nil {
					user = ex["user_id"].(string)
				}
				token = f.token(user)
			}
			var send any
			if body != nil {
				send = body
			}
			doc.checkAnswer(t, op, f.call(method, url, token, send))
			// A method the path does not serve is answered as documented too.
			r := f.call(http.MethodPatch, url, token, nil)
			if r.status != http.StatusMethodNotAllowed {
				t.Fatalf("PATCH %s answered %d (%s), want 405", url, r.status, r.body)
			}
			doc.checkAnswer(t, op, r)
		})
	}
}

// checkAnswer holds an answer against op's documented responses: its status,
// the headers the response names, its content type, and in a JSON body the
// required fields and string enums.
func (d openAPIDoc) checkAnswer(t *testing.T, op operation, r response) {
	t.Helper()
	documented, ok := op.Responses[strconv.Itoa(r.status)]
	if !ok {
		t.Fatalf("answered %d (%s), which is not documented", r.status, r.body)
	}
	res := d.response(t, documented)
	for h := range res.Headers {
		if r.header.Get(h) == "" {
			t.Errorf("answered %d without the documented header %s", r.status, h)
		}
	}
	ct, _, _ := mime.ParseMediaType(r.header.Get("Content-Type"))
	media, ok := res.Content[ct]
	if !ok {
		t.Fatalf("answered %d with Content-Type %q; documented: %v", r.status, ct, keys(res.Content))
	}
	if ct != "application/json" {
		return
	}
	sch := d.schema(t, media.Schema)
	var got map[string]any
	r.decode(t, &got)
	for _, field := range sch.Required {
		if _, ok := got[field]; !ok {
			t.Errorf("answer %s lacks the required field %s", r.body, field)
		}
	}
	for field, ps := range sch.Props {
		if v, ok := got[field].(string); ok && len(ps.Enum) > 0 && !slices.Contains(ps.Enum, v) {
			t.Errorf("%s = %q is not one of the documented %v", field, v, ps.Enum)
		}
	}
}

// TestOpenAPIErrorCodes: the documented codes are exactly the server's (every
// Code constant in the package's source).
func TestOpenAPIErrorCodes(t *testing.T) {
	doc := loadOpenAPI(t)
	documented := doc.Components.Schemas["Error"].Props["code"].Enum
	codes := serverCodes(t)
	sort.Strings(documented)
	sort.Strings(codes)
	if !slices.Equal(documented, codes) {
		t.Fatalf("documented codes %v, server codes %v", documented, codes)
	}
	// And docs/api.md's error table names every one of them.
	md, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range codes {
		if !strings.Contains(string(md), "`"+c+"`") {
			t.Errorf("docs/api.md does not mention %s", c)
		}
	}
}

// serverCodes reads every constant of type Code declared in the package's
// source, so that a code added to the server cannot be missed here.
func serverCodes(t *testing.T) []string {
	t.Helper()
	var codes []string
	for _, f := range testharness.ParseGoFiles(t, ".") {
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if typ, ok := vs.Type.(*ast.Ident); !ok || typ.Name != "Code" {
					continue
				}
				for _, v := range vs.Values {
					lit, ok := v.(*ast.BasicLit)
					if !ok || lit.Kind != token.STRING {
						t.Fatalf("a Code constant that is not a string literal: %T", v)
					}
					c, err := strconv.Unquote(lit.Value)
					if err != nil {
						t.Fatal(err)
					}
					codes = append(codes, c)
				}
			}
		}
	}
	if len(codes) == 0 {
		t.Fatal("no Code constant found in the package's source")
	}
	return codes
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
