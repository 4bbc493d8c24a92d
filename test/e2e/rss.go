package e2e

// The memory the whole environment takes: the resident set of every
// process it started, found by the directories on their command lines (and
// their children, e.g. PostgreSQL's backends) and by the nodes' cgroups (the
// pods' containers).

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// pgDirPrefix starts the name of the PostgreSQL directory (pgtest Name "e2e").
const pgDirPrefix = "/pgtest-e2e-"

// RSS returns the resident memory in KiB by part ("dc-a control plane",
// "dc-a node", "pods", "postgres+pgbouncers", "webhooks") and in total.
// Shared pages count once per process, as the kernel reports them.
func (e *Env) RSS() (map[string]int64, int64) {
	type proc struct {
		ppid    int
		cmdline string
		rss     int64
	}
	procs := map[int]proc{}
	entries, _ := os.ReadDir("/proc")
	for _, en := range entries {
		pid, err := strconv.Atoi(en.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", en.Name(), "cmdline"))
		if err != nil {
			continue
		}
		ppid, rss := statusOf(pid)
		procs[pid] = proc{ppid: ppid, cmdline: strings.ReplaceAll(string(cmd), "\x00", " "), rss: rss}
	}
	part := map[int]string{}
	// Containers first: their command lines name nothing of ours.
	for _, dc := range e.DCs {
		if dc.Node == nil {
			continue
		}
		for _, pid := range cgroupPids(dc.Node.CgroupRoot()) {
			part[pid] = "pods"
		}
	}
	for pid, p := range procs {
		if _, ok := part[pid]; ok {
			continue
		}
		switch {
		// The postmaster names its data directory; its backends are its
		// children.
		case strings.Contains(p.cmdline, pgDirPrefix), strings.Contains(procs[p.ppid].cmdline, pgDirPrefix),
			strings.Contains(p.cmdline, e.dir+"/pgbouncer-"):
			part[pid] = "postgres+pgbouncers"
		case strings.Contains(p.cmdline, " webhook --cluster-name="):
			part[pid] = "webhooks"
		}
		for _, dc := range e.DCs {
			switch {
			case dc.Node != nil && strings.Contains(p.cmdline, dc.Node.Dir()+"/"):
				part[pid] = dc.Name + " node" // kubelet, containerd, shims
			case dc.Cluster != nil && strings.Contains(p.cmdline, dc.Cluster.Dir()+"/") && !strings.Contains(p.cmdline, " webhook "):
				part[pid] = dc.Name + " control plane" // etcd, apiserver, kcm, scheduler
			}
		}
	}
	out := map[string]int64{}
	var total int64
	for pid, name := range part {
		out[name] += procs[pid].rss
		total += procs[pid].rss
	}
	return out, total
}

// statusOf reads a process's parent and VmRSS (KiB) from /proc/pid/status.
func statusOf(pid int) (ppid int, rss int64) {
	f, err := os.Open(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		fields := strings.Fields(v)
		if len(fields) == 0 {
			continue
		}
		switch k {
		case "PPid":
			ppid, _ = strconv.Atoi(fields[0])
		case "VmRSS":
			rss, _ = strconv.ParseInt(fields[0], 10, 64)
		}
	}
	return ppid, rss
}

// cgroupPids lists the processes in a cgroup subtree of the memory
// hierarchy.
func cgroupPids(root string) []int {
	var pids []int
	_ = filepath.WalkDir(filepath.Join("/sys/fs/cgroup/memory", root), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.Name() != "cgroup.procs" {
			return nil
		}
		b, _ := os.ReadFile(p)
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return nil
	})
	return pids
}
