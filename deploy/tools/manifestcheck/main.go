// Command manifestcheck reads the multi-document YAML that `helm template` prints and checks each
// object the way the API server would before storing it:
//
//   - Strict decoding into the Kubernetes API's own Go types (client-go's scheme, plus the
//     monitoring.coreos.com types of the Prometheus operator). A field the type does not have, a
//     key given twice, or a value of the wrong JSON type is an error; so is a kind no registered
//     type knows, unless it is named with -unknown-ok (custom resources whose Go types are not
//     linked in here).
//   - For every object that carries a pod template (Deployment, DaemonSet, StatefulSet, Job,
//     CronJob, Pod), the Pod Security Standards evaluator of k8s.io/pod-security-admission, the
//     code the admission plugin runs, at the Kubernetes version given by -psa-version, on the
//     pod as the API server would store it (host-network ports defaulted to host ports). The
//     report names the most restrictive level the pod meets and, for each stricter level, why
//     it does not.
//
// Output is one JSON object per document on stdout; the exit status is 1 when any document
// failed to decode, so that a shell pipeline fails too. Pod Security levels are reported, not
// judged: which workload must meet which level is the caller's policy.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes/scheme"
	psaapi "k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	"sigs.k8s.io/yaml"
)

// maxDocumentBytes bounds one YAML document; a rendered chart object is a few kilobytes.
const maxDocumentBytes = 4 << 20

// Result is what the checker says about one document.
type Result struct {
	APIVersion  string       `json:"apiVersion,omitempty"`
	Kind        string       `json:"kind,omitempty"`
	Name        string       `json:"name,omitempty"`
	Decoded     bool         `json:"decoded"`
	Error       string       `json:"error,omitempty"`
	Skipped     string       `json:"skipped,omitempty"`
	PodSecurity *PodSecurity `json:"podSecurity,omitempty"`
}

// PodSecurity is the evaluator's verdict on one pod template.
type PodSecurity struct {
	// Level is the most restrictive Pod Security level the pod meets.
	Level string `json:"level"`
	// Forbidden lists, per stricter level, the checks the pod fails and why.
	Forbidden map[string][]string `json:"forbidden,omitempty"`
}

func main() {
	psaVersion := flag.String("psa-version", "v1.31", "Kubernetes version of the Pod Security Standards (v1.minor)")
	unknownOK := flag.String("unknown-ok", "", "comma-separated group/version/Kind list that may be absent from the scheme")
	flag.Parse()

	version, err := psaapi.ParseVersion(*psaVersion)
	if err != nil {
		fmt.Fprintf(os.Stderr, "manifestcheck: -psa-version %q: %v\n", *psaVersion, err)
		os.Exit(2)
	}
	allowed := map[string]bool{}
	for _, gvk := range strings.Split(*unknownOK, ",") {
		if gvk = strings.TrimSpace(gvk); gvk != "" {
			allowed[gvk] = true
		}
	}
	checker, err := newChecker(version, allowed)
	if err != nil {
		fmt.Fprintf(os.Stderr, "manifestcheck: %v\n", err)
		os.Exit(2)
	}
	failed, err := checker.run(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "manifestcheck: %v\n", err)
		os.Exit(2)
	}
	if failed {
		os.Exit(1)
	}
}

type checker struct {
	decoder   runtime.Decoder
	evaluator policy.Evaluator
	version   psaapi.Version
	unknownOK map[string]bool
}

func newChecker(version psaapi.Version, unknownOK map[string]bool) (*checker, error) {
	types := runtime.NewScheme()
	if err := scheme.AddToScheme(types); err != nil {
		return nil, fmt.Errorf("client-go scheme: %w", err)
	}
	if err := monitoringv1.AddToScheme(types); err != nil {
		return nil, fmt.Errorf("monitoring.coreos.com/v1 types: %w", err)
	}
	evaluator, err := policy.NewEvaluator(policy.DefaultChecks())
	if err != nil {
		return nil, fmt.Errorf("pod security evaluator: %w", err)
	}
	decoder := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, types, types,
		kjson.SerializerOptions{Yaml: true, Strict: true})
	return &checker{decoder: decoder, evaluator: evaluator, version: version, unknownOK: unknownOK}, nil
}

// run checks every document of in and writes one JSON line per document to out.
func (c *checker) run(in io.Reader, out io.Writer) (failed bool, err error) {
	reader := utilyaml.NewYAMLReader(bufio.NewReaderSize(in, 64<<10))
	encoder := json.NewEncoder(out)
	for {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return failed, nil
		}
		if err != nil {
			return failed, fmt.Errorf("reading YAML: %w", err)
		}
		if len(doc) > maxDocumentBytes {
			return failed, fmt.Errorf("a document of %d bytes is over the %d-byte limit", len(doc), maxDocumentBytes)
		}
		if isEmpty(doc) {
			continue
		}
		result := c.check(doc)
		if !result.Decoded && result.Skipped == "" {
			failed = true
		}
		if err := encoder.Encode(result); err != nil {
			return failed, err
		}
	}
}

// isEmpty is true for a document of only comments and blank lines (Helm prints one per
// template that renders nothing).
func isEmpty(doc []byte) bool {
	for _, line := range bytes.Split(doc, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) > 0 && line[0] != '#' && !bytes.Equal(line, []byte("---")) {
			return false
		}
	}
	return true
}

func (c *checker) check(doc []byte) Result {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name string `json:"name"`
		} `json:"metadata"`
	}
	// YAMLToJSONStrict refuses duplicate keys, which the typed decoder below would not see.
	asJSON, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return Result{Error: fmt.Sprintf("YAML: %v", err)}
	}
	if err := json.Unmarshal(asJSON, &head); err != nil {
		return Result{Error: fmt.Sprintf("not an object: %v", err)}
	}
	result := Result{APIVersion: head.APIVersion, Kind: head.Kind, Name: head.Metadata.Name}
	obj, gvk, err := c.decoder.Decode(asJSON, nil, nil)
	switch {
	case err != nil && runtime.IsNotRegisteredError(err) && c.unknownOK[head.APIVersion+"/"+head.Kind]:
		result.Skipped = "no Go type linked in for this kind"
		return result
	case err != nil:
		result.Error = err.Error()
		return result
	}
	result.Decoded = true
	if gvk.Kind != head.Kind {
		result.Decoded, result.Error = false, fmt.Sprintf("decoded as %s, not %s", gvk.Kind, head.Kind)
		return result
	}
	if meta, spec := podTemplate(obj); spec != nil {
		result.PodSecurity = c.evaluate(meta, podDefaults(spec))
	}
	return result
}

// podTemplate returns the pod metadata and spec an object would create, if it creates pods.
func podTemplate(obj runtime.Object) (*metav1.ObjectMeta, *corev1.PodSpec) {
	switch o := obj.(type) {
	case *corev1.Pod:
		return &o.ObjectMeta, &o.Spec
	case *appsv1.Deployment:
		return &o.Spec.Template.ObjectMeta, &o.Spec.Template.Spec
	case *appsv1.DaemonSet:
		return &o.Spec.Template.ObjectMeta, &o.Spec.Template.Spec
	case *appsv1.StatefulSet:
		return &o.Spec.Template.ObjectMeta, &o.Spec.Template.Spec
	case *appsv1.ReplicaSet:
		return &o.Spec.Template.ObjectMeta, &o.Spec.Template.Spec
	case *batchv1.Job:
		return &o.Spec.Template.ObjectMeta, &o.Spec.Template.Spec
	case *batchv1.CronJob:
		return &o.Spec.JobTemplate.Spec.Template.ObjectMeta, &o.Spec.JobTemplate.Spec.Template.Spec
	}
	return nil, nil
}

// podDefaults returns the spec as the API server stores a pod made from it, where that changes
// the Pod Security verdict: on the host network every container port is a host port, and the
// server sets hostPort to containerPort in each pod it admits (SetDefaults_PodSpec; no longer
// in pod templates since Kubernetes 1.28, so a template's own verdict would miss it).
func podDefaults(spec *corev1.PodSpec) *corev1.PodSpec {
	if !spec.HostNetwork {
		return spec
	}
	out := spec.DeepCopy()
	for _, containers := range [][]corev1.Container{out.InitContainers, out.Containers} {
		for i := range containers {
			for j := range containers[i].Ports {
				if port := &containers[i].Ports[j]; port.HostPort == 0 {
					port.HostPort = port.ContainerPort
				}
			}
		}
	}
	return out
}

// evaluate finds the most restrictive level the pod meets, trying restricted, then baseline.
func (c *checker) evaluate(meta *metav1.ObjectMeta, spec *corev1.PodSpec) *PodSecurity {
	verdict := &PodSecurity{Level: string(psaapi.LevelPrivileged), Forbidden: map[string][]string{}}
	for _, level := range []psaapi.Level{psaapi.LevelRestricted, psaapi.LevelBaseline} {
		lv := psaapi.LevelVersion{Level: level, Version: c.version}
		aggregate := policy.AggregateCheckResults(c.evaluator.EvaluatePod(lv, meta, spec))
		if aggregate.Allowed {
			verdict.Level = string(level)
			break
		}
		reasons := make([]string, len(aggregate.ForbiddenReasons))
		for i := range aggregate.ForbiddenReasons {
			reasons[i] = aggregate.ForbiddenReasons[i] + " (" + aggregate.ForbiddenDetails[i] + ")"
		}
		verdict.Forbidden[string(level)] = reasons
	}
	return verdict
}
