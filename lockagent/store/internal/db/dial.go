package db

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Dial is the dial function of every connection a Store makes: TCP
// keepalives that find a peer gone silent (keepAliveDialer), and no cancel
// request ever (neverCancel).
func Dial() pgconn.DialFunc { return neverCancel(keepAliveDialer.DialContext) }

// noCancelNetwork is the network a connection dialled by neverCancel
// reports as its remote address's: the dial function refuses it.
const noCancelNetwork = "dislock-no-cancel"

// keepAliveDialer finds a connection whose peer went away without a word (a
// partition, a node gone) within about 25 s of silence, where pgx's
// default waits 5 minutes before its first probe: a decision's try is not
// cut short by a timeout while it waits for an answer (a herd queued in
// PgBouncer must not give up; see the agent's retry), so a dead connection
// has to end it. A pooler or server that is alive but slow answers the
// probes from its kernel and is waited for.
var keepAliveDialer = &net.Dialer{KeepAliveConfig: net.KeepAliveConfig{
	Enable: true, Idle: 10 * time.Second, Interval: 5 * time.Second, Count: 3}}

// neverCancel wraps a dial function so that the connections it makes never
// send a cancel request. A call that runs out of time closes its connection,
// and pgx then sends PostgreSQL a cancel request for the running statement,
// dialling the connection's remote address. Cancelled while its commit waits
// for the synchronous standby, a claim is committed on the primary and
// visible to every cluster, yet a failover can lose it. Without the cancel,
// the commit keeps waiting, invisible, until the standby has it. A statement
// dislock abandons finishes on its own: every one is short.
func neverCancel(dial pgconn.DialFunc) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if network == noCancelNetwork {
			return nil, errors.New("dislock never cancels a statement")
		}
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return noCancelConn{c}, nil
	}
}

type noCancelConn struct{ net.Conn }

func (c noCancelConn) RemoteAddr() net.Addr { return noCancelAddr{c.Conn.RemoteAddr()} }

type noCancelAddr struct{ net.Addr }

func (noCancelAddr) Network() string { return noCancelNetwork }

// TCPAddr is the TCP address a connection Dial made is connected to; ok is
// false for another kind (a Unix socket).
func TCPAddr(a net.Addr) (tcp *net.TCPAddr, ok bool) {
	if nc, isNC := a.(noCancelAddr); isNC {
		a = nc.Addr
	}
	tcp, ok = a.(*net.TCPAddr)
	return tcp, ok
}

// Addrs names every host:port a (possibly multi-host) connection string
// tries, in order, for error messages.
func Addrs(cfg *pgx.ConnConfig) string {
	hosts := []string{HostPort(cfg.Host, cfg.Port)}
	for _, f := range cfg.Fallbacks {
		if a := HostPort(f.Host, f.Port); a != hosts[len(hosts)-1] {
			hosts = append(hosts, a)
		}
	}
	return strings.Join(hosts, ",")
}

// HostPort is host:port, a Unix socket's directory as unix:<dir>.
func HostPort(host string, port uint16) string {
	if strings.HasPrefix(host, "/") {
		host = "unix:" + host
	}
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}
