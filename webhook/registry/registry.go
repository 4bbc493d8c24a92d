package registry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
)

// This file holds what keeps a registry lookup inside its bounds: which hosts
// may be contacted and how (destinationPolicy), how much of an answer is read
// (guardedTransport), and what a tenant is told when a lookup fails
// (RegistryError). A tenant names the registry in its image, so everything a
// registry sends is hostile input: the webhook runs with failurePolicy Fail,
// and a registry that makes it run out of memory or time stops Job creation
// for every tenant of the cluster.

// RegistryErrorClass is the kind of cause a tenant is told about. The
// registry's own words (error bodies, headers) are never passed on: the
// registry may be anyone's, and the denial and its Event are shown to the
// tenant, so a reflected answer would make the webhook a way to read internal
// services.
type RegistryErrorClass string

// The classes of RegistryError.
const (
	// RegistryTimeout: the registry was asked and did not answer in time.
	RegistryTimeout RegistryErrorClass = "timeout"
	// RegistryBusy: the registry was never asked, because the lookup found
	// no free lookup slot within the review's budget (the webhook's slots
	// were held by other lookups, see lookupSlots). Not the registry's
	// fault, so not a timeout: a tenant told its registry is slow looks in
	// the wrong place.
	RegistryBusy         RegistryErrorClass = "busy"
	RegistryTooLarge     RegistryErrorClass = "too large"
	RegistryNotAllowed   RegistryErrorClass = "not allowed"
	RegistryUnauthorized RegistryErrorClass = "unauthorized"
	RegistryNotFound     RegistryErrorClass = "not found"
	RegistryUnreachable  RegistryErrorClass = "unreachable"
	RegistryInvalid      RegistryErrorClass = "invalid"
)

// RegistryError is a failed lookup as the tenant sees it: a class and a
// message written by the webhook. The underlying cause is kept for errors.Is
// and the webhook's own log, never for Error().
type RegistryError struct {
	Class RegistryErrorClass
	msg   string
	cause error
}

func (e *RegistryError) Error() string { return string(e.Class) + ": " + e.msg }
func (e *RegistryError) Unwrap() error { return e.cause }

func registryErr(class RegistryErrorClass, cause error, format string, args ...any) *RegistryError {
	return &RegistryError{Class: class, msg: fmt.Sprintf(format, args...), cause: cause}
}

// classifyRegistryError turns whatever a lookup returned into a RegistryError.
// recorded is the first refusal of the lookup's transport, used when the
// library dropped it from the error chain.
func classifyRegistryError(ctx context.Context, err, recorded error, timeout time.Duration) *RegistryError {
	var re *RegistryError
	if errors.As(err, &re) {
		return re
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return registryErr(RegistryTimeout, err, "the registry did not answer in time (the lookup may take %s, inside the admission timeout)", timeout)
	}
	if errors.As(recorded, &re) {
		return &RegistryError{Class: re.Class, msg: re.msg, cause: errors.Join(err, recorded)}
	}
	var terr *transport.Error
	if errors.As(err, &terr) {
		switch terr.StatusCode {
		case http.StatusUnauthorized, http.StatusForbidden:
			return registryErr(RegistryUnauthorized, err, "the registry refused access; check the pod's imagePullSecrets (HTTP %d)", terr.StatusCode)
		case http.StatusNotFound:
			return registryErr(RegistryNotFound, err, "the image is not in the registry (HTTP %d)", terr.StatusCode)
		}
		return registryErr(RegistryUnreachable, err, "the registry answered HTTP %d", terr.StatusCode)
	}
	var nerr net.Error
	if errors.As(err, &nerr) && nerr.Timeout() {
		return registryErr(RegistryTimeout, err, "the registry did not answer in time (the lookup may take %s, inside the admission timeout)", timeout)
	}
	return registryErr(RegistryUnreachable, err, "the registry could not be queried (the webhook's log has the details)")
}

// hostPatterns are registry hosts as an operator lists them: "host" (any
// port) or "host:port", with "*" matching within one DNS label
// ("*.example.com", "10.0.0.*", "registry.local:*"). Matching ignores case.
type hostPatterns []string

func (ps hostPatterns) match(hostport string) bool {
	hostport = strings.ToLower(hostport)
	host, port := splitHostPort(hostport)
	for _, p := range ps {
		p = strings.ToLower(p)
		pHost, pPort := splitHostPort(p)
		if pPort != "" && pPort != "*" && pPort != port {
			continue
		}
		if registryHostMatches(pHost, host) {
			return true
		}
	}
	return false
}

// validateHostPatterns reports patterns that can never match.
func validateHostPatterns(what string, ps []string) error {
	var errs []error
	for _, p := range ps {
		host, port := splitHostPort(p)
		switch {
		case host == "" || strings.ContainsAny(p, "/ \t@?#"):
			errs = append(errs, fmt.Errorf("%s: %q is not a registry host pattern (want e.g. registry.example.com, *.example.com or 10.0.0.5:5000)", what, p))
		case port != "" && port != "*" && strings.Trim(port, "0123456789") != "":
			errs = append(errs, fmt.Errorf("%s: %q has a bad port (want a number or *)", what, p))
		}
	}
	return errors.Join(errs...)
}

// splitHostPort splits "host:port", "[v6]:port", "host" and "[v6]"; the port
// is "" when absent. A bare IPv6 address has no port.
//
// The host is canonical, so that a list entry and a name that reach the same
// place compare equal: without a trailing dot ("registry.example." resolves
// as "registry.example"), and an IP address in its shortest form, an IPv4
// address mapped into IPv6 as plain IPv4.
func splitHostPort(hostport string) (host, port string) {
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		host, port = h, p
	} else {
		host = hostport
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if ip, err := netip.ParseAddr(host); err == nil {
		host = ip.Unmap().String()
	}
	return host, port
}

// destinationPolicy decides which hosts a lookup may contact, and how.
type destinationPolicy struct {
	allowed  hostPatterns // when non-empty, the image's registry must match
	denied   hostPatterns // never contacted, not even through a redirect
	insecure hostPatterns // may be spoken to over plain HTTP
	private  hostPatterns // may resolve to loopback or private addresses
	// anyInsecure is the --insecure-registry test switch: plain HTTP and
	// private addresses for every host (never link-local).
	anyInsecure bool
}

// checkRegistry is asked before a lookup's first request: may the image's
// registry be queried at all?
func (p *destinationPolicy) checkRegistry(hostport string) error {
	if p.denied.match(hostport) {
		return registryErr(RegistryNotAllowed, nil, "registry %s is on the webhook's deny list", hostport)
	}
	if len(p.allowed) > 0 && !p.allowed.match(hostport) {
		return registryErr(RegistryNotAllowed, nil, "registry %s is not on the webhook's allow list", hostport)
	}
	return nil
}

// checkURL is asked for every request, including redirects and token
// servers the registry names: those hosts are the registry's choice, so the
// allow list (the operator's trust in the registry) does not apply to them,
// but the deny list and the plain-HTTP rule do.
func (p *destinationPolicy) checkURL(u *url.URL) error {
	hostport := urlHostPort(u)
	if p.denied.match(hostport) {
		return registryErr(RegistryNotAllowed, nil, "the registry, or a redirect or token server it names, is on the webhook's deny list")
	}
	switch u.Scheme {
	case "https":
	case "http":
		if !p.anyInsecure && !p.insecure.match(hostport) {
			return registryErr(RegistryNotAllowed, nil, "the registry, or a redirect or token server it names, needs plain HTTP, which the webhook allows only for hosts it lists as insecure")
		}
	default:
		return registryErr(RegistryNotAllowed, nil, "the registry named a URL that is neither HTTPS nor HTTP")
	}
	return nil
}

// checkRedirect is asked for a redirect's target before it is followed:
// the dial would refuse a forbidden address too, but only after the client's
// own redirect check, whose refusal carries no class.
func (p *destinationPolicy) checkRedirect(ctx context.Context, u *url.URL) error {
	if err := p.checkURL(u); err != nil {
		return err
	}
	hostport := urlHostPort(u)
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", u.Hostname())
	if err != nil {
		return nil // the dial reports it
	}
	for _, ip := range ips {
		if err := p.checkAddress(hostport, ip); err != nil {
			return err
		}
	}
	return nil
}

// checkAddress is asked for every address a lookup is about to connect to,
// after name resolution, so that neither a DNS name pointing inside the
// cluster nor a later change of its answer (rebinding) gets around it.
//
// An IPv6 address that carries an IPv4 one (NAT64, 6to4) is judged by that
// IPv4 address too: a NAT64 gateway would forward it there.
func (p *destinationPolicy) checkAddress(hostport string, ip netip.Addr) error {
	ip = ip.Unmap()
	if v4, ok := embeddedIPv4(ip); ok {
		if err := p.checkAddress(hostport, v4); err != nil {
			return err
		}
	}
	_, port := splitHostPort(hostport)
	switch {
	// A denied address is denied under any name that resolves to it.
	case p.denied.match(net.JoinHostPort(ip.String(), port)):
		return registryErr(RegistryNotAllowed, nil, "the registry, or a redirect or token server it names, resolves to an address on the webhook's deny list")
	// Link-local addresses hold cloud metadata services (169.254.169.254)
	// and are never a registry: refused whatever the lists say.
	case ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsInterfaceLocalMulticast() ||
		ip.IsMulticast() || ip.IsUnspecified() || !ip.IsValid() || inAny(ip, neverContacted):
		return registryErr(RegistryNotAllowed, nil, "the registry, or a redirect or token server it names, resolves to an address the webhook never contacts (link-local, multicast, reserved or unspecified)")
	case ip.IsLoopback() || ip.IsPrivate() || inAny(ip, privateToo):
		if !p.anyInsecure && !p.private.match(hostport) {
			return registryErr(RegistryNotAllowed, nil, "the registry, or a redirect or token server it names, resolves to a loopback or private address, which the webhook contacts only for hosts it lists as private")
		}
	}
	return nil
}

var (
	// neverContacted are ranges no registry lives in: "this network",
	// protocol assignments, benchmarking, reserved, broadcast.
	neverContacted = prefixes("0.0.0.0/8", "192.0.0.0/24", "198.18.0.0/15", "240.0.0.0/4")
	// privateToo are private in all but name: carrier-grade NAT (often
	// cluster-internal) and the deprecated IPv6 site-local range.
	privateToo = prefixes("100.64.0.0/10", "fec0::/10")
	nat64      = prefixes("64:ff9b::/96", "64:ff9b:1::/48")
	sixToFour  = netip.MustParsePrefix("2002::/16")
)

func prefixes(ps ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ps))
	for i, p := range ps {
		out[i] = netip.MustParsePrefix(p)
	}
	return out
}

func inAny(ip netip.Addr, ps []netip.Prefix) bool {
	for _, p := range ps {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// embeddedIPv4 is the IPv4 address a NAT64 (its last 32 bits) or 6to4 (bits
// 16 to 48) address carries.
func embeddedIPv4(ip netip.Addr) (netip.Addr, bool) {
	if !ip.Is6() {
		return netip.Addr{}, false
	}
	b := ip.As16()
	switch {
	case inAny(ip, nat64):
		return netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]}), true
	case sixToFour.Contains(ip):
		return netip.AddrFrom4([4]byte{b[2], b[3], b[4], b[5]}), true
	}
	return netip.Addr{}, false
}

// urlHostPort is u's host with the scheme's default port made explicit, so
// that patterns with a port match URLs without one.
func urlHostPort(u *url.URL) string {
	if u.Port() != "" {
		return strings.ToLower(u.Host)
	}
	port := "443"
	if u.Scheme == "http" {
		port = "80"
	}
	return strings.ToLower(net.JoinHostPort(u.Hostname(), port))
}

// guardedTransport is a Resolver's connection pool: it dials only addresses
// the policy allows. Each lookup wraps it in a lookupTransport.
type guardedTransport struct {
	policy *destinationPolicy
	base   *http.Transport
	// maxBlob bounds a blob (config) response, maxOther any other response
	// (manifests, tokens, errors, redirects to a blob store).
	maxBlob, maxOther int64
	// bytesRead counts response body bytes read from registries; tests
	// assert on it.
	bytesRead atomic.Int64
}

func newGuardedTransport(policy *destinationPolicy, maxManifest, maxConfig int64) *guardedTransport {
	g := &guardedTransport{policy: policy, maxBlob: maxConfig, maxOther: max(maxManifest, maxConfig)}
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	g.base = &http.Transport{
		// No proxy from the environment: the dial check below would judge
		// the proxy's address, not the registry's.
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, port, err := net.SplitHostPort(addr)
			if err != nil {
				return nil, err
			}
			ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
			if err != nil {
				return nil, err
			}
			// Every address is checked before any is dialled: a name with
			// one public and one private address is refused, not tried in
			// turn.
			for _, ip := range ips {
				if err := policy.checkAddress(addr, ip); err != nil {
					return nil, err
				}
			}
			var errs []error
			for _, ip := range ips {
				// Dial the checked address, not the name again: a second
				// resolution could answer differently.
				conn, err := dialer.DialContext(ctx, network, net.JoinHostPort(ip.Unmap().String(), port))
				if err == nil {
					return conn, nil
				}
				errs = append(errs, err)
			}
			return nil, errors.Join(errs...)
		},
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           64,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    5 * time.Second,
		ExpectContinueTimeout:  time.Second,
		MaxResponseHeaderBytes: 64 << 10,
	}
	return g
}

// lookupTransport is one lookup's view of the guarded transport: it checks
// every request's URL and every redirect's target, bounds every response
// body, and remembers its first refusal, which go-containerregistry may
// report only as text.
type lookupTransport struct {
	g *guardedTransport

	mu      sync.Mutex
	refusal error
}

func (t *lookupTransport) refuse(err error) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.refusal == nil {
		t.refusal = err
	}
	return err
}

func (t *lookupTransport) firstRefusal() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.refusal
}

func (t *lookupTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := t.g.policy.checkURL(req.URL); err != nil {
		return nil, t.refuse(err)
	}
	resp, err := t.g.base.RoundTrip(req)
	if err != nil {
		var re *RegistryError
		if errors.As(err, &re) {
			t.refuse(re)
		}
		return nil, err
	}
	// A redirect is checked here, before the client follows it, so that a
	// refusal keeps its class (the client's own check reports only text).
	if loc := resp.Header.Get("Location"); loc != "" && resp.StatusCode >= 300 && resp.StatusCode < 400 {
		if target, perr := req.URL.Parse(loc); perr == nil {
			if err := t.g.policy.checkRedirect(req.Context(), target); err != nil {
				resp.Body.Close()
				return nil, t.refuse(err)
			}
		}
	}
	limit := t.g.maxOther
	if strings.Contains(req.URL.Path, "/blobs/") {
		limit = t.g.maxBlob
	}
	// A declared length above the bound is refused before its body is read.
	if resp.ContentLength > limit {
		resp.Body.Close()
		return nil, t.refuse(registryErr(RegistryTooLarge, nil, "the registry's answer declares %d bytes, more than the %d the webhook reads", resp.ContentLength, limit))
	}
	resp.Body = &limitedBody{rc: resp.Body, left: limit, limit: limit, t: t}
	return resp, nil
}

// limitedBody fails a body that goes on past its bound (chunked, or longer
// than it declared) instead of reading it.
type limitedBody struct {
	rc          io.ReadCloser
	left, limit int64
	t           *lookupTransport
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// One byte more tells a body of exactly the bound from a longer one.
		var one [1]byte
		n, err := b.rc.Read(one[:])
		b.t.g.bytesRead.Add(int64(n))
		if n > 0 {
			return 0, b.t.refuse(registryErr(RegistryTooLarge, nil, "the registry's answer is longer than the %d bytes the webhook reads", b.limit))
		}
		return 0, err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.rc.Read(p)
	b.left -= int64(n)
	b.t.g.bytesRead.Add(int64(n))
	return n, err
}

func (b *limitedBody) Close() error { return b.rc.Close() }
