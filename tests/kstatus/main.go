// kstatus-check: what kstatus (sigs.k8s.io/cli-utils/pkg/kstatus/status, the library Flux, kpt and
// cli-utils' apply use to wait for resources) computes for Kubernetes objects.
//
// Usage: kstatus-check < objects.json   (a JSON array of objects; one JSON line per object on stdout)
package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
)

type result struct {
	Status  string `json:"status"`
	Message string `json:"message"`
}

func main() {
	// apimachinery's JSON reads whole numbers as int64, as the API machinery does (kstatus expects that).
	var objects []map[string]interface{}
	data, err := io.ReadAll(os.Stdin)
	if err == nil {
		err = utiljson.Unmarshal(data, &objects)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "kstatus-check: reading objects:", err)
		os.Exit(2)
	}
	out := json.NewEncoder(os.Stdout)
	for _, object := range objects {
		computed, err := status.Compute(&unstructured.Unstructured{Object: object})
		if err != nil {
			fmt.Fprintln(os.Stderr, "kstatus-check:", err)
			os.Exit(1)
		}
		if err := out.Encode(result{Status: computed.Status.String(), Message: computed.Message}); err != nil {
			os.Exit(1)
		}
	}
}
