// Command kubelet-devicemanager runs kubelet's own device manager and topology manager
// (k8s.io/kubernetes/pkg/kubelet/cm/devicemanager and topologymanager, the release go.mod
// names), wired the way kubelet's container manager wires them (container_manager_linux.go:
// the device manager is a hint provider of the topology manager, whose Admit runs the hint
// providers and then Allocate), so that gputopo's tests drive the real code a node runs.
//
// The device manager serves its registration socket at the fixed path
// /var/lib/kubelet/device-plugins/kubelet.sock. To give every test a folder of its own, the
// program re-executes itself in a new mount namespace where --dir is bind-mounted on that path
// (root only, like kubelet itself); nothing outside the namespace sees the mount.
//
// Protocol: one JSON command per stdin line, one JSON answer per stdout line; klog goes to
// stderr. Commands (field "op"):
//
//	wait    {healthy, timeout}  until `healthy` devices are healthy: {ok, registered, capacity, healthy, numa}
//	alloc   {pod, n}            admit a pod of one container asking n devices: {ok, admit, reason, devices, env, cdi}
//	free    {pod}               the pod ends; its devices are released: {ok}
//	restart {socket, again}     kubelet restarts (a new manager from the checkpoint); with again, once more
//	                            right after the plugin served `socket` anew: {ok}
//	adopt   {pods}              after a restart, these pods are the running ones: {ok, pods: {pod: devices}}
//	quit                        stop and exit
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	cadvisorapi "github.com/google/cadvisor/info/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/containermap"
	"k8s.io/kubernetes/pkg/kubelet/cm/devicemanager"
	"k8s.io/kubernetes/pkg/kubelet/cm/topologymanager"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/lifecycle"
)

const (
	pluginDir   = "/var/lib/kubelet/device-plugins"
	inNamespace = "GPUTOPO_DEVICEMANAGER_NAMESPACED"
	container   = "main"
)

type options struct {
	dir      string
	resource string
	policy   string
	scope    string
	numa     int
}

// driver holds the managers and the pods kubelet considers active.
type driver struct {
	opts   options
	logger klog.Logger
	mu     sync.Mutex
	active map[string]*v1.Pod
	tm     topologymanager.Manager
	dm     *devicemanager.ManagerImpl
}

func main() {
	var o options
	flag.StringVar(&o.dir, "dir", "", "the device-plugins folder (kubelet's /var/lib/kubelet/device-plugins)")
	flag.StringVar(&o.resource, "resource", "nvidia.com/gpu", "the extended resource the plugin serves")
	flag.StringVar(&o.policy, "policy", "none", "topology manager policy: none, best-effort, restricted, single-numa-node")
	flag.StringVar(&o.scope, "scope", "container", "topology manager scope: container or pod")
	flag.IntVar(&o.numa, "numa", 2, "NUMA nodes of the simulated machine")
	klog.InitFlags(nil)
	flag.Parse()
	if o.dir == "" {
		fail("--dir is required")
	}
	if os.Getenv(inNamespace) == "" {
		os.Exit(reexec(o))
	}
	if err := bindDir(o.dir); err != nil {
		fail(err.Error())
	}
	d := &driver{opts: o, logger: klog.Background(), active: map[string]*v1.Pod{}}
	if err := d.start(); err != nil {
		fail(err.Error())
	}
	reply(map[string]any{"event": "started", "dir": o.dir, "policy": o.policy, "numa": o.numa})
	d.serve()
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "kubelet-devicemanager:", msg)
	reply(map[string]any{"event": "error", "error": msg})
	os.Exit(2)
}

// reexec runs this program again in a new mount namespace (and waits for it), passing stdin and
// stdout through, so that the bind mount of --dir is private to it.
func reexec(o options) int {
	self, err := os.Executable()
	if err != nil {
		fail(err.Error())
	}
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), inNamespace+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		fail(fmt.Sprintf("a private mount namespace needs root (CAP_SYS_ADMIN): %v", err))
	}
	_ = cmd.Wait()
	if cmd.ProcessState == nil {
		return 1
	}
	return cmd.ProcessState.ExitCode()
}

func bindDir(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making / private in the new namespace: %w", err)
	}
	if err := os.MkdirAll(pluginDir, 0o750); err != nil {
		return err
	}
	if err := syscall.Mount(abs, pluginDir, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting %s on %s: %w", abs, pluginDir, err)
	}
	return nil
}

func (d *driver) machine() []cadvisorapi.Node {
	nodes := make([]cadvisorapi.Node, d.opts.numa)
	for i := range nodes {
		nodes[i] = cadvisorapi.Node{Id: i, Cores: []cadvisorapi.Core{{Id: i, Threads: []int{i}}}}
	}
	return nodes
}

// start builds both managers as kubelet's container manager does, and starts the device
// manager's registration server (which reads its checkpoint and cleans the folder).
func (d *driver) start() error {
	tm, err := topologymanager.NewManager(d.logger, d.machine(), d.opts.policy, d.opts.scope, nil)
	if err != nil {
		return fmt.Errorf("topology manager: %w", err)
	}
	dm, err := devicemanager.NewManagerImpl(d.logger, d.machine(), tm)
	if err != nil {
		return fmt.Errorf("device manager: %w", err)
	}
	tm.AddHintProvider(d.logger, dm)
	ready := config.NewSourcesReady(func(sets.Set[string]) bool { return true })
	if err := dm.Start(d.logger, d.activePods, ready, containermap.NewContainerMap(), sets.New[string]()); err != nil {
		return fmt.Errorf("device manager start: %w", err)
	}
	d.tm, d.dm = tm, dm
	return nil
}

func (d *driver) activePods() []*v1.Pod {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]*v1.Pod, 0, len(d.active))
	for _, p := range d.active {
		out = append(out, p)
	}
	return out
}

func reply(v map[string]any) {
	b, _ := json.Marshal(v)
	os.Stdout.Write(append(b, '\n'))
}

func (d *driver) serve() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	for in.Scan() {
		var cmd map[string]any
		if err := json.Unmarshal(in.Bytes(), &cmd); err != nil {
			reply(map[string]any{"ok": false, "error": err.Error()})
			continue
		}
		op, _ := cmd["op"].(string)
		switch op {
		case "wait":
			reply(d.wait(int(num(cmd, "healthy", 0)), num(cmd, "timeout", 10)))
		case "alloc":
			reply(d.alloc(str(cmd, "pod"), int(num(cmd, "n", 1))))
		case "free":
			reply(d.free(str(cmd, "pod")))
		case "restart":
			again, _ := cmd["again"].(bool)
			reply(d.restart(str(cmd, "socket"), again))
		case "adopt":
			reply(d.adopt(cmd["pods"]))
		case "quit":
			_ = d.dm.Stop(d.logger)
			reply(map[string]any{"ok": true})
			return
		default:
			reply(map[string]any{"ok": false, "error": fmt.Sprintf("unknown op %q", op)})
		}
	}
	_ = d.dm.Stop(d.logger)
}

func num(cmd map[string]any, key string, def float64) float64 {
	if v, ok := cmd[key].(float64); ok {
		return v
	}
	return def
}

func str(cmd map[string]any, key string) string {
	v, _ := cmd[key].(string)
	return v
}

// state is what kubelet's node status would report: capacity (GetCapacity, which also drops
// resources whose plugin is gone past the grace period) and the healthy devices with their NUMA
// nodes.
func (d *driver) state() map[string]any {
	capacity, _, _ := d.dm.GetCapacity(d.logger)
	q, registered := capacity[v1.ResourceName(d.opts.resource)]
	healthy := []string{}
	numa := map[string][]int64{}
	for id, dev := range d.dm.GetAllocatableDevices(d.logger)[d.opts.resource] {
		healthy = append(healthy, id)
		nodes := []int64{}
		if dev.Topology != nil {
			for _, n := range dev.Topology.Nodes {
				nodes = append(nodes, n.ID)
			}
		}
		numa[id] = nodes
	}
	sort.Strings(healthy)
	return map[string]any{"registered": registered, "capacity": q.Value(), "healthy": healthy, "numa": numa}
}

func (d *driver) wait(healthy int, timeout float64) map[string]any {
	end := time.Now().Add(time.Duration(timeout * float64(time.Second)))
	for {
		st := d.state()
		if len(st["healthy"].([]string)) == healthy {
			st["ok"] = true
			return st
		}
		if time.Now().After(end) {
			st["ok"] = false
			return st
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (d *driver) pod(name string, n int) *v1.Pod {
	q := *resource.NewQuantity(int64(n), resource.DecimalSI)
	res := v1.ResourceList{v1.ResourceName(d.opts.resource): q}
	return &v1.Pod{
		ObjectMeta: metav1ObjectMeta(name),
		Spec: v1.PodSpec{Containers: []v1.Container{{
			Name:      container,
			Resources: v1.ResourceRequirements{Requests: res, Limits: res},
		}}},
	}
}

// alloc admits a pod through the topology manager (kubelet's admit handler for resources),
// which asks the device manager for hints and then Allocate (GetPreferredAllocation, Allocate).
func (d *driver) alloc(name string, n int) map[string]any {
	pod := d.pod(name, n)
	d.mu.Lock()
	d.active[name] = pod
	d.mu.Unlock()
	ctx := klog.NewContext(context.Background(), d.logger)
	res := d.tm.Admit(ctx, &lifecycle.PodAdmitAttributes{Pod: pod, OtherPods: d.activePods(), Operation: lifecycle.AddOperation})
	if !res.Admit {
		d.mu.Lock()
		delete(d.active, name)
		d.mu.Unlock()
		d.dm.UpdateAllocatedDevices(d.logger)
		return map[string]any{"ok": true, "admit": false, "reason": res.Reason, "message": res.Message}
	}
	opts, err := d.dm.GetDeviceRunContainerOptions(ctx, pod, &pod.Spec.Containers[0])
	if err != nil {
		return map[string]any{"ok": false, "admit": true, "error": err.Error()}
	}
	env := map[string]string{}
	cdi := []string{}
	if opts != nil {
		for _, e := range opts.Envs {
			env[e.Name] = e.Value
		}
		for _, c := range opts.CDIDevices {
			cdi = append(cdi, c.Name)
		}
	}
	return map[string]any{"ok": true, "admit": true, "devices": d.devices(name), "env": env, "cdi": cdi}
}

func (d *driver) devices(name string) []string {
	out := []string{}
	for id := range d.dm.GetDevices(name, container)[d.opts.resource] {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

func (d *driver) free(name string) map[string]any {
	d.mu.Lock()
	delete(d.active, name)
	d.mu.Unlock()
	d.dm.UpdateAllocatedDevices(d.logger)
	return map[string]any{"ok": true}
}

// restart stops the device manager and starts a new one, as a kubelet restart does: the new
// one reads the checkpoint and cleans the folder, so plugins must register again. With
// `again`, kubelet restarts a second time right after the plugin served `socket` anew.
func (d *driver) restart(socket string, again bool) map[string]any {
	d.mu.Lock()
	d.active = map[string]*v1.Pod{}
	d.mu.Unlock()
	if err := d.dm.Stop(d.logger); err != nil {
		return map[string]any{"ok": false, "error": err.Error()}
	}
	if err := d.start(); err != nil {
		return map[string]any{"ok": false, "error": err.Error()}
	}
	if again {
		path := filepath.Join(pluginDir, socket)
		end := time.Now().Add(15 * time.Second)
		for {
			if _, err := os.Stat(path); err == nil {
				break
			}
			if time.Now().After(end) {
				return map[string]any{"ok": false, "error": "the plugin did not serve " + socket + " again"}
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err := d.dm.Stop(d.logger); err != nil {
			return map[string]any{"ok": false, "error": err.Error()}
		}
		if err := d.start(); err != nil {
			return map[string]any{"ok": false, "error": err.Error()}
		}
	}
	return map[string]any{"ok": true}
}

func (d *driver) adopt(raw any) map[string]any {
	names, _ := raw.([]any)
	pods := map[string]any{}
	d.mu.Lock()
	for _, v := range names {
		if name, ok := v.(string); ok {
			d.active[name] = d.pod(name, 0)
		}
	}
	d.mu.Unlock()
	for _, v := range names {
		if name, ok := v.(string); ok {
			pods[name] = d.devices(name)
		}
	}
	return map[string]any{"ok": true, "pods": pods}
}

func metav1ObjectMeta(name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name)}
}
