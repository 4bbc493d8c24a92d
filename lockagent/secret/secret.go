// Package secret keeps the agent's database credential out of what other
// processes can read of the agent.
//
// The kubelet hands the credential to the sidecar in its environment (a
// secretKeyRef). The kernel shows a program's original environment block in
// /proc/<pid>/environ for as long as that program image runs, whatever the
// program later does to its own copy (os.Unsetenv changes only the Go
// runtime's). With shareProcessNamespace every container of the pod sees the
// agent's /proc entry, and an app running as the agent's uid (the webhook
// picks one apps rarely use, 65533, but an app may) could read the
// credential there.
//
// Take therefore, in the same process (execve keeps the PID; there is no
// parent and child to keep in step), unless the process is the init of its
// own PID namespace (see Take):
//  1. makes the process non-dumpable at once: the kernel then refuses its
//     /proc/<pid>/environ, mem, fd and root, and ptrace, to every process
//     without CAP_SYS_PTRACE, even one of the same uid;
//  2. writes the credential into a pipe and re-executes its own binary with
//     the same arguments and an environment without the credential; the
//     pipe's read end is the one file it passes on;
//  3. in the re-executed image, makes the process non-dumpable again (execve
//     resets it) before it reads the pipe, so no other process can open the
//     pipe through /proc/<pid>/fd meanwhile, then closes the pipe.
package secret

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// fdEnv tells the re-executed image which inherited file holds the
// credential. It is internal to Take: the webhook never sets it.
const fdEnv = "DISLOCK_AGENT_CREDENTIAL_FD"

// maxLen bounds what the re-executed image reads from the pipe; a pipe holds
// 64 KiB by default, far more than any database URL.
const maxLen = 1 << 16

// self is the running executable, even when its path is not in this mount
// namespace or was replaced on disk since.
const self = "/proc/self/exe"

// Take returns the value of the environment variable name and makes sure no
// other process can read it from this one, as the package comment explains.
// It is meant to be the first thing the program does: in the first image it
// normally does not return (the process re-executes itself and calls Take
// again); in the re-executed image it returns the value.
//
// Take watches the stop signals from its first statement. One that arrives
// before the hand-off is committed (before execve in the first image, before
// Take returns in the re-executed one) is returned as stopped, and the caller
// should end as if stopped before it started. From then until the caller has
// installed its own handling, a stop signal takes its default action and
// ends the process, which has done nothing yet: a stop is never lost.
//
// An error means the credential could not be moved out of the environment
// (or the process could not be made non-dumpable); value is still the
// credential, and the caller may go on with a warning.
func Take(name string, stops ...os.Signal) (value string, stopped os.Signal, err error) {
	sigs := make(chan os.Signal, 1)
	if len(stops) > 0 { // none would mean every signal
		signal.Notify(sigs, stops...)
	}
	dumpErr := nonDumpable()
	if fd, ok := os.LookupEnv(fdEnv); ok {
		value, err = receive(fd)
		return value, stop(sigs), errors.Join(dumpErr, err)
	}
	value = os.Getenv(name)
	if value == "" {
		return "", stop(sigs), dumpErr
	}
	if os.Getpid() == 1 {
		// The init of its own PID namespace: a container that does not
		// share the pod's process namespace, whose /proc no other
		// container sees. The hand-off would protect nothing, and the
		// kernel drops a signal sent to a namespace's init while its
		// action is the default one, which the hand-off needs for a
		// moment: the kubelet's SIGTERM would be lost.
		os.Unsetenv(name)
		return value, stop(sigs), dumpErr
	}
	stopped, err = handOff(name, value, sigs, stops)
	return value, stopped, errors.Join(dumpErr, err)
}

// stop ends the watch and returns the stop signal that arrived meanwhile, if
// any. signal.Stop returns only once every signal caught before it has been
// delivered to the channel, so none falls between the watch and the default
// action.
func stop(sigs chan os.Signal) os.Signal {
	signal.Stop(sigs)
	select {
	case s := <-sigs:
		return s
	default:
		return nil
	}
}

// NonDumpable makes the calling process non-dumpable: the kernel then
// refuses its /proc/<pid>/environ, mem, fd and root, and ptrace, to every
// process without CAP_SYS_PTRACE. For a process that has the credential in
// its environment and cannot re-execute itself without it (the sidecar's
// postStart hook, which the kubelet execs with the container's environment).
func NonDumpable() error { return nonDumpable() }

func nonDumpable() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("making the process non-dumpable: %w", err)
	}
	return nil
}

// handOff re-executes the program with the credential in a pipe instead of
// the environment. It returns only when a stop signal came first or
// something failed.
func handOff(name, value string, sigs chan os.Signal, stops []os.Signal) (os.Signal, error) {
	var p [2]int
	// Non-blocking, so that a credential larger than the pipe fails here
	// instead of blocking forever on a pipe nobody reads yet.
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return stop(sigs), fmt.Errorf("creating the hand-off pipe: %w", err)
	}
	r, w := p[0], p[1]
	n, err := unix.Write(w, []byte(value))
	if err == nil && n < len(value) {
		err = fmt.Errorf("wrote %d of %d bytes", n, len(value))
	}
	err = errors.Join(err, unix.Close(w))
	if err == nil {
		// The read end alone survives execve.
		_, err = unix.FcntlInt(uintptr(r), unix.F_SETFD, 0)
	}
	if err != nil {
		unix.Close(r)
		return stop(sigs), fmt.Errorf("writing the credential into the hand-off pipe: %w", err)
	}
	env := []string{fdEnv + "=" + strconv.Itoa(r)}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, name+"=") && !strings.HasPrefix(kv, fdEnv+"=") {
			env = append(env, kv)
		}
	}
	// execve ends every thread but the calling one. A stop signal caught by
	// a handler on another thread that had not finished when execve ended
	// that thread would be lost: the re-executed image would run on as if
	// never stopped. So from here the stop signals take their default
	// action, which the kernel carries out itself and ends the process
	// whichever thread it is given to; one caught before is in sigs, which
	// stop drains.
	restore := defaultActions(stops)
	if s := stop(sigs); s != nil {
		restore()
		unix.Close(r)
		return s, nil
	}
	err = syscall.Exec(self, os.Args, env)
	restore()
	unix.Close(r)
	return nil, fmt.Errorf("re-executing %s: %w", self, err)
}

// kernelSigaction is the kernel's struct sigaction for rt_sigaction on
// linux/amd64 and linux/arm64: handler, flags, restorer, mask.
type kernelSigaction struct {
	handler  uintptr
	flags    uint64
	restorer uintptr
	mask     uint64
}

// defaultActions sets the signals' disposition to the default action in the
// kernel (the Go runtime offers no way to: without a channel it still runs
// its own handler) and returns what puts the earlier ones back.
func defaultActions(sigs []os.Signal) (restore func()) {
	type saved struct {
		sig int
		old kernelSigaction
	}
	var done []saved
	for _, s := range sigs {
		n, ok := s.(syscall.Signal)
		if !ok {
			continue
		}
		var act, old kernelSigaction // handler 0 is SIG_DFL
		if _, _, errno := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(n), uintptr(unsafe.Pointer(&act)), uintptr(unsafe.Pointer(&old)), 8, 0, 0); errno == 0 {
			done = append(done, saved{int(n), old})
		}
	}
	return func() {
		for _, d := range done {
			unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(d.sig), uintptr(unsafe.Pointer(&d.old)), 0, 8, 0, 0)
		}
	}
}

// receive reads the credential the first image left in the inherited pipe
// and closes it.
func receive(fdText string) (string, error) {
	os.Unsetenv(fdEnv)
	fd, err := strconv.Atoi(fdText)
	if err != nil || fd < 3 {
		return "", fmt.Errorf("%s=%q is not an inherited file descriptor", fdEnv, fdText)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
		return "", fmt.Errorf("%s=%d is not the hand-off pipe", fdEnv, fd)
	}
	buf := make([]byte, maxLen+1)
	var got int
	for got < len(buf) {
		n, err := unix.Read(fd, buf[got:])
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			// EAGAIN included: the first image closed its end before
			// execve, so a pipe with a writer left is not its pipe.
			return "", fmt.Errorf("reading the hand-off pipe: %w", err)
		case n == 0:
			return string(buf[:got]), nil
		}
		got += n
	}
	return "", fmt.Errorf("the hand-off pipe holds more than %d bytes", maxLen)
}
