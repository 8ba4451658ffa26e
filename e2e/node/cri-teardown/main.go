// Command cri-teardown stops and removes every pod sandbox of one CRI runtime, as `crictl rmp -fa`
// does (the cri-tools module is not served here). Stopping a sandbox makes the runtime run CNI DEL, so the
// test node's veths, IP allocations and network namespaces go away with it. Used by the real-node tests
// (e2e/src/node) when a node is torn down, after the kubelet has been stopped.
//
//	cri-teardown unix:///path/to/containerd.sock
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: cri-teardown unix:///path/to/runtime.sock")
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	conn, err := grpc.NewClient(os.Args[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, "cri-teardown: connect:", err)
		os.Exit(1)
	}
	defer conn.Close()
	client := runtime.NewRuntimeServiceClient(conn)
	list, err := client.ListPodSandbox(ctx, &runtime.ListPodSandboxRequest{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "cri-teardown: list sandboxes:", err)
		os.Exit(1)
	}
	failed := 0
	for _, sandbox := range list.Items {
		name := sandbox.Metadata.Namespace + "/" + sandbox.Metadata.Name
		if _, err := client.StopPodSandbox(ctx, &runtime.StopPodSandboxRequest{PodSandboxId: sandbox.Id}); err != nil {
			fmt.Fprintf(os.Stderr, "cri-teardown: stop %s: %v\n", name, err)
			failed++
			continue
		}
		if _, err := client.RemovePodSandbox(ctx, &runtime.RemovePodSandboxRequest{PodSandboxId: sandbox.Id}); err != nil {
			fmt.Fprintf(os.Stderr, "cri-teardown: remove %s: %v\n", name, err)
			failed++
		}
	}
	fmt.Printf("cri-teardown: removed %d of %d pod sandboxes\n", len(list.Items)-failed, len(list.Items))
	if failed > 0 {
		os.Exit(1)
	}
}
