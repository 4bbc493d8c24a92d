// Package gateway is the lock gateway: a service of dislock's own, one per
// cluster, that holds the only database login and runs each pod's lock calls
// (store.Locks) on the pod's behalf, so that a tenant namespace holds no
// database credential at all.
//
// Why it exists (docs/design.md, "The lock gateway: one login, many
// namespaces"): with a
// PostgreSQL role per namespace, a pooler keeps a pool per role, so server
// connections and logins grow with namespaces × clusters instead of with
// load, and PgBouncer needs a superuser's auth_query to learn each role.
// A login role shared by the namespaces would let one of them change the
// role's password or settings, end the others' backends, or leave session
// state on a pooled connection for the next namespace's transaction. The
// gateway shares its connections among namespaces without sharing a login
// with them: a pod proves its namespace with a credential the gateway
// checks, may name only keys under "<namespace>/" and owners of its own
// namespace and cluster, and never sees SQL.
//
// The wire is HTTPS: POST /v1/<call> with a JSON body and the namespace and
// its credential as HTTP basic authentication (internal/wire). Errors travel
// as kinds that the pods' client (lockagent/gateway/client) turns back into
// the store package's errors, so the agent decides the same way on either
// path. Which namespace a credential belongs to the database says
// (credentials.go); `dislock gateway` (internal/gatewaycmd) runs the server.
//
// The server (server.go) keeps two lanes, each with its own connections:
// decisions (the herd at the top of the hour) and renewals (heartbeats,
// outcomes, releases), so that a holder's renewal never queues behind other
// pods' decisions. A call waits in its lane's queue for a connection, the
// namespaces with calls waiting taking turns (lane.go); once started it
// runs to its end even if the pod stops waiting, so a pooler between the
// gateway and PostgreSQL never sees a statement abandoned mid-flight. The
// queue is bounded, in all and per namespace: past either bound a call is
// refused at once as unavailable, and the pod retries later as it does when
// the database is unreachable.
//
// The sidecar links the client and the wire only, never this package
// (test/repo checks it); no part imports Kubernetes code.
package gateway
