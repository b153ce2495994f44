// Command toolrun-netpol enforces Kubernetes NetworkPolicy on one node with iptables.
//
// It is the test cluster's NetworkPolicy implementation (the usual ones cannot be built
// here, see tests/cluster/README.md). It watches pods, namespaces and NetworkPolicies and
// renders, on every change, a set of filter-table chains:
//
//	FORWARD -> TOOLRUN-NETPOL            (pod to pod, bridged traffic with br_netfilter)
//	INPUT -s <pod cidr> -> TOOLRUN-NETPOL (pod to this node, e.g. the API server)
//	TOOLRUN-NETPOL: established traffic returns at once; new traffic from an
//	  egress-isolated pod jumps to TRN-E-<pod>, to an ingress-isolated pod to TRN-I-<pod>.
//	TRN-[EI]-<pod>: each allowed peer/port sets the allow mark; a packet without it is
//	  dropped, one with it has the mark cleared and returns.
//	TRN-KNOWN: fail closed. New traffic whose source is in the pod network but is not the
//	  address of a pod this controller has programmed is dropped, as Calico drops traffic of
//	  workload endpoints it does not know yet. A pod created after a deny-all egress policy
//	  that selects it therefore has no window between its start and its rules: until the
//	  controller has seen its address it can send nothing, not even to the API server.
//	  Traffic from the node to its pods does not pass here (OUTPUT, not FORWARD).
//
// Supported: policyTypes, podSelector, namespaceSelector, both together, ipBlock with except,
// ports with protocol, numeric and named ports, endPort. Traffic from the node itself to its
// pods (kubelet probes) is always allowed, as the API documents.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	netv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	listersnetv1 "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

const (
	mainChain  = "TOOLRUN-NETPOL"
	chainPfx   = "TRN-"
	knownChain = "TRN-KNOWN"
	allowMark  = "0x10000000/0x10000000"
	exceptMark = "0x20000000/0x20000000"
)

type controller struct {
	pods       listerscorev1.PodLister
	nss        listerscorev1.NamespaceLister
	pols       listersnetv1.NetworkPolicyLister
	podCIDR    string
	iptables   string
	last       string
	failClosed bool
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file")
	podCIDR := flag.String("pod-cidr", "10.88.0.0/16", "pod network, hooked in INPUT for egress rules")
	ipt := flag.String("iptables", "iptables", "iptables command (iptables-restore and iptables-save beside it)")
	resync := flag.Duration("resync", 30*time.Second, "full resync period")
	cleanup := flag.Bool("cleanup", false, "remove every rule and chain this program made, then exit")
	failOpen := flag.Bool("fail-open", false, "let traffic of pods not programmed yet pass (the old behaviour; for comparison only)")
	flag.Parse()

	c := &controller{podCIDR: *podCIDR, iptables: *ipt, failClosed: !*failOpen}
	if *cleanup {
		if err := c.cleanup(); err != nil {
			log.Fatalf("cleanup: %v", err)
		}
		return
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		log.Fatalf("kubeconfig: %v", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		log.Fatalf("client: %v", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	f := informers.NewSharedInformerFactory(cs, *resync)
	kick := make(chan struct{}, 1)
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { trigger(kick) },
		UpdateFunc: func(any, any) { trigger(kick) },
		DeleteFunc: func(any) { trigger(kick) },
	}
	pi, ni, poli := f.Core().V1().Pods(), f.Core().V1().Namespaces(), f.Networking().V1().NetworkPolicies()
	for _, inf := range []cache.SharedIndexInformer{pi.Informer(), ni.Informer(), poli.Informer()} {
		if _, err := inf.AddEventHandler(h); err != nil {
			log.Fatalf("handler: %v", err)
		}
	}
	c.pods, c.nss, c.pols = pi.Lister(), ni.Lister(), poli.Lister()
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			log.Fatalf("cache sync failed for %v", typ)
		}
	}
	log.Printf("toolrun-netpol: caches synced, enforcing NetworkPolicy (pod cidr %s)", c.podCIDR)
	tick := time.NewTicker(*resync)
	defer tick.Stop()
	trigger(kick)
	for {
		select {
		case <-ctx.Done():
			log.Printf("toolrun-netpol: stopping (rules stay until -cleanup)")
			return
		case <-tick.C:
			c.last = "" // reapply even if unchanged, in case someone flushed the rules
		case <-kick:
			time.Sleep(50 * time.Millisecond) // coalesce bursts of events
		}
		if err := c.sync(); err != nil {
			log.Printf("toolrun-netpol: sync failed: %v", err)
			time.AfterFunc(time.Second, func() { trigger(kick) })
		}
	}
}

func trigger(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func chainName(kind string, pod *corev1.Pod) string {
	sum := sha256.Sum256([]byte(pod.Namespace + "/" + pod.Name + "/" + string(pod.UID)))
	return chainPfx + kind + "-" + strings.ToUpper(hex.EncodeToString(sum[:8]))
}

func active(p *corev1.Pod) bool {
	return p.Status.PodIP != "" && !p.Spec.HostNetwork &&
		p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

func selects(sel *metav1.LabelSelector, l map[string]string) bool {
	if sel == nil {
		return true
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return false
	}
	return s.Matches(labels.Set(l))
}

// peerPods resolves a NetworkPolicyPeer with pod and/or namespace selectors to pods.
func (c *controller) peerPods(polNS string, peer netv1.NetworkPolicyPeer, all []*corev1.Pod) []*corev1.Pod {
	nsOK := map[string]bool{}
	if peer.NamespaceSelector == nil {
		nsOK[polNS] = true
	} else {
		nss, _ := c.nss.List(labels.Everything())
		for _, ns := range nss {
			if selects(peer.NamespaceSelector, ns.Labels) {
				nsOK[ns.Name] = true
			}
		}
	}
	var out []*corev1.Pod
	for _, p := range all {
		if nsOK[p.Namespace] && selects(peer.PodSelector, p.Labels) {
			out = append(out, p)
		}
	}
	return out
}

// portMatches renders the port part of a rule; named ports resolve on pod (nil: skip them).
func portMatches(ports []netv1.NetworkPolicyPort, pod *corev1.Pod) []string {
	if len(ports) == 0 {
		return []string{""}
	}
	var out []string
	for _, pp := range ports {
		proto := corev1.ProtocolTCP
		if pp.Protocol != nil {
			proto = *pp.Protocol
		}
		p := strings.ToLower(string(proto))
		switch {
		case pp.Port == nil:
			out = append(out, "-p "+p)
		case pp.Port.Type == 0: // int
			if pp.EndPort != nil {
				out = append(out, fmt.Sprintf("-p %s --dport %d:%d", p, pp.Port.IntVal, *pp.EndPort))
			} else {
				out = append(out, fmt.Sprintf("-p %s --dport %d", p, pp.Port.IntVal))
			}
		default: // named
			if pod == nil {
				continue
			}
			for _, ct := range pod.Spec.Containers {
				for _, cp := range ct.Ports {
					cpProto := cp.Protocol
					if cpProto == "" {
						cpProto = corev1.ProtocolTCP
					}
					if cp.Name == pp.Port.StrVal && cpProto == proto {
						out = append(out, fmt.Sprintf("-p %s --dport %d", p, cp.ContainerPort))
					}
				}
			}
		}
	}
	return out
}

// rules renders the allow rules of one pod's chain for one direction.
func (c *controller) rules(chain string, pod *corev1.Pod, pols []*netv1.NetworkPolicy, ingress bool, all []*corev1.Pod) []string {
	var out []string
	add := func(format string, a ...any) { out = append(out, "-A "+chain+" "+fmt.Sprintf(format, a...)) }
	dir := "-d"
	if ingress {
		dir = "-s"
	}
	allow := func(match string) { add("%s -j MARK --set-xmark %s", strings.TrimSpace(match), allowMark) }
	add("-j MARK --set-xmark 0/%s", strings.Split(allowMark, "/")[1])
	for _, pol := range pols {
		type rule struct {
			peers []netv1.NetworkPolicyPeer
			ports []netv1.NetworkPolicyPort
		}
		var rs []rule
		if ingress {
			for _, r := range pol.Spec.Ingress {
				rs = append(rs, rule{r.From, r.Ports})
			}
		} else {
			for _, r := range pol.Spec.Egress {
				rs = append(rs, rule{r.To, r.Ports})
			}
		}
		for _, r := range rs {
			if len(r.peers) == 0 { // every peer
				target := pod
				if !ingress {
					target = nil
				}
				for _, pm := range portMatches(r.ports, target) {
					allow(pm)
				}
				continue
			}
			for _, peer := range r.peers {
				if peer.IPBlock != nil {
					// The test cluster is IPv4 only (iptables, not ip6tables): an IPv6
					// block matches nothing here, and iptables-restore refuses it.
					if strings.Contains(peer.IPBlock.CIDR, ":") {
						continue
					}
					for _, ex := range peer.IPBlock.Except {
						if strings.Contains(ex, ":") {
							continue
						}
						add("%s %s -j MARK --set-xmark %s", dir, ex, exceptMark)
					}
					for _, pm := range portMatches(r.ports, map[bool]*corev1.Pod{true: pod}[ingress]) {
						allow(fmt.Sprintf("%s %s -m mark ! --mark %s %s", dir, peer.IPBlock.CIDR, exceptMark, pm))
					}
					add("-j MARK --set-xmark 0/%s", strings.Split(exceptMark, "/")[1])
					continue
				}
				for _, pp := range c.peerPods(pol.Namespace, peer, all) {
					portPod := pod
					if !ingress {
						portPod = pp
					}
					for _, pm := range portMatches(r.ports, portPod) {
						allow(fmt.Sprintf("%s %s/32 %s", dir, pp.Status.PodIP, pm))
					}
				}
			}
		}
	}
	add("-m mark ! --mark %s -j DROP", allowMark)
	add("-j MARK --set-xmark 0/%s", strings.Split(allowMark, "/")[1])
	return out
}

func (c *controller) sync() error {
	podsAll, err := c.pods.List(labels.Everything())
	if err != nil {
		return err
	}
	var pods []*corev1.Pod
	for _, p := range podsAll {
		if active(p) {
			pods = append(pods, p)
		}
	}
	sort.Slice(pods, func(i, j int) bool {
		return pods[i].Namespace+"/"+pods[i].Name < pods[j].Namespace+"/"+pods[j].Name
	})
	pols, err := c.pols.List(labels.Everything())
	if err != nil {
		return err
	}
	sort.Slice(pols, func(i, j int) bool { return pols[i].Namespace+"/"+pols[i].Name < pols[j].Namespace+"/"+pols[j].Name })

	var chains []string
	var body []string
	dispatch := []string{"-A " + mainChain + " -m conntrack --ctstate RELATED,ESTABLISHED -j RETURN"}
	if c.failClosed {
		// Every source in the pod network passes TRN-KNOWN first: a known pod returns, anything
		// else in the pod network is dropped before any policy is looked at.
		chains = append(chains, knownChain)
		dispatch = append(dispatch, fmt.Sprintf("-A %s -s %s -j %s", mainChain, c.podCIDR, knownChain))
		for _, pod := range pods {
			body = append(body, fmt.Sprintf("-A %s -s %s/32 -j RETURN", knownChain, pod.Status.PodIP))
		}
		body = append(body, fmt.Sprintf("-A %s -j DROP", knownChain))
	}
	isolated := 0
	for _, pod := range pods {
		var in, eg []*netv1.NetworkPolicy
		for _, pol := range pols {
			if pol.Namespace != pod.Namespace || !selects(&pol.Spec.PodSelector, pod.Labels) {
				continue
			}
			types := pol.Spec.PolicyTypes
			if len(types) == 0 {
				types = []netv1.PolicyType{netv1.PolicyTypeIngress}
				if len(pol.Spec.Egress) > 0 {
					types = append(types, netv1.PolicyTypeEgress)
				}
			}
			for _, t := range types {
				if t == netv1.PolicyTypeIngress {
					in = append(in, pol)
				} else if t == netv1.PolicyTypeEgress {
					eg = append(eg, pol)
				}
			}
		}
		if len(eg) > 0 {
			ch := chainName("E", pod)
			chains = append(chains, ch)
			dispatch = append(dispatch, fmt.Sprintf("-A %s -s %s/32 -j %s", mainChain, pod.Status.PodIP, ch))
			body = append(body, c.rules(ch, pod, eg, false, pods)...)
		}
		if len(in) > 0 {
			ch := chainName("I", pod)
			chains = append(chains, ch)
			dispatch = append(dispatch, fmt.Sprintf("-A %s -d %s/32 -j %s", mainChain, pod.Status.PodIP, ch))
			body = append(body, c.rules(ch, pod, in, true, pods)...)
		}
		if len(eg)+len(in) > 0 {
			isolated++
		}
	}

	existing, err := c.ourChains()
	if err != nil {
		return err
	}
	want := map[string]bool{}
	for _, ch := range chains {
		want[ch] = true
	}
	var b bytes.Buffer
	b.WriteString("*filter\n:" + mainChain + " - [0:0]\n")
	for _, ch := range chains {
		b.WriteString(":" + ch + " - [0:0]\n")
	}
	var stale []string
	for _, ch := range existing {
		if !want[ch] {
			stale = append(stale, ch)
			b.WriteString(":" + ch + " - [0:0]\n")
		}
	}
	for _, l := range dispatch {
		b.WriteString(l + "\n")
	}
	for _, l := range body {
		b.WriteString(l + "\n")
	}
	for _, ch := range stale {
		b.WriteString("-X " + ch + "\n")
	}
	b.WriteString("COMMIT\n")
	if b.String() == c.last {
		return c.ensureJumps()
	}
	cmd := exec.Command(c.iptables+"-restore", "--noflush")
	cmd.Stdin = bytes.NewReader(b.Bytes())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s-restore: %v: %s\ninput:\n%s", c.iptables, err, out, b.String())
	}
	if err := c.ensureJumps(); err != nil {
		return err
	}
	c.last = b.String()
	log.Printf("toolrun-netpol: synced %d policies, %d pods, %d isolated, %d chains", len(pols), len(pods), isolated, len(chains))
	return nil
}

func (c *controller) ourChains() ([]string, error) {
	out, err := exec.Command(c.iptables+"-save", "-t", "filter").Output()
	if err != nil {
		return nil, fmt.Errorf("%s-save: %v", c.iptables, err)
	}
	var chains []string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, ":"+chainPfx) {
			chains = append(chains, strings.Fields(l[1:])[0])
		}
	}
	return chains, nil
}

func (c *controller) jumps() [][]string {
	return [][]string{
		{"FORWARD", "-m", "comment", "--comment", "toolrun netpol", "-j", mainChain},
		{"INPUT", "-s", c.podCIDR, "-m", "comment", "--comment", "toolrun netpol", "-j", mainChain},
	}
}

func (c *controller) ensureJumps() error {
	for _, j := range c.jumps() {
		if exec.Command(c.iptables, append([]string{"-w", "-C"}, j...)...).Run() == nil {
			continue
		}
		args := append([]string{"-w", "-I", j[0], "1"}, j[1:]...)
		if out, err := exec.Command(c.iptables, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("iptables %v: %v: %s", args, err, out)
		}
	}
	return nil
}

func (c *controller) cleanup() error {
	for _, j := range c.jumps() {
		for exec.Command(c.iptables, append([]string{"-w", "-D"}, j...)...).Run() == nil {
		}
	}
	chains, err := c.ourChains()
	if err != nil {
		return err
	}
	for _, ch := range append([]string{mainChain}, chains...) {
		_ = exec.Command(c.iptables, "-w", "-F", ch).Run()
	}
	for _, ch := range append([]string{mainChain}, chains...) {
		_ = exec.Command(c.iptables, "-w", "-X", ch).Run()
	}
	fmt.Fprintln(os.Stderr, "toolrun-netpol: cleaned up")
	return nil
}
