// Command loadgen drives one unary gRPC method of Booster at a fixed concurrency (closed loop),
// or starts calls at a fixed rate whatever the answers (-rate, open loop: as a fleet whose
// agents each report once a minute does), and prints a JSON summary.
//
// With -streams each host (each distinct token) sends its requests as messages on one
// long-lived bidirectional stream of its own, opened before the load starts, and waits for the
// answer to each before its next: the stream-per-agent pattern of xDS, measured against one
// call per request. With -wait-go it connects (and opens its streams), says "ready" on stderr
// and starts the load when a line arrives on stdin, so a caller can leave the setup out of what
// it measures.
//
// Requests are pre-serialized protobuf messages read from a file (each prefixed with its
// length as a varint) and sent as raw bytes, round-robin, so that the load generator spends
// almost no CPU per call and leaves the machine to the server under test. Calls still in
// flight when the duration ends are awaited, not cancelled, so every call has an answer.
package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// address matches a host:port in an error message, so messages that differ only in the
// connection's ports are counted as one.
var address = regexp.MustCompile(`\d+\.\d+\.\d+\.\d+:\d+`)

// rawCodec passes request and response bytes through untouched.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(b []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), b...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

type summary struct {
	Calls    int            `json:"calls"`
	Codes    map[string]int `json:"codes"`
	Messages map[string]int `json:"messages"`
	Seconds  float64        `json:"seconds"`
	P50Ms    float64        `json:"p50_ms"`
	P99Ms    float64        `json:"p99_ms"`
}

func readRequests(path string) ([][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := bufio.NewReader(f)
	var out [][]byte
	for {
		n, err := binary.ReadUvarint(r)
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		buf := make([]byte, n)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		out = append(out, buf)
	}
}

// callContexts gives each request its call context: one shared token, or request i's own from
// the tokens file (as many lines as requests).
func callContexts(token, path string, n int) ([]context.Context, error) {
	bearer := func(t string) context.Context {
		return metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+t)
	}
	if path == "" {
		return []context.Context{bearer(token)}, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) != n {
		return nil, fmt.Errorf("%s: %d tokens for %d requests", path, len(lines), n)
	}
	out := make([]context.Context, n)
	for i, t := range lines {
		out[i] = bearer(t)
	}
	return out, nil
}

func percentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p / 100 * float64(len(sorted)-1))
	return float64(sorted[i].Microseconds()) / 1000
}

func main() {
	target := flag.String("target", "127.0.0.1:50051", "host:port")
	method := flag.String("method", "/gemini.booster.v1.Booster/ReportAggregates", "full method")
	requests := flag.String("requests", "", "file of length-prefixed serialized requests")
	concurrency := flag.Int("concurrency", 128, "calls in flight")
	connections := flag.Int("connections", 16, "client connections")
	duration := flag.Duration("duration", 15*time.Second, "how long to start new calls")
	token := flag.String("token", "", "bearer token")
	tokens := flag.String("tokens", "", "file of bearer tokens, one a line: request i is sent with token i (a host's own)")
	rate := flag.Float64("rate", 0, "calls started per second (open loop); 0: closed loop at -concurrency")
	timeout := flag.Duration("timeout", 0, "each call's deadline (0: none)")
	streams := flag.Bool("streams", false, "each host's requests as messages on one stream of its own (bidirectional)")
	waitGo := flag.Bool("wait-go", false, `connect, say "ready" on stderr, start on a line from stdin`)
	flag.Parse()

	reqs, err := readRequests(*requests)
	if err != nil || len(reqs) == 0 {
		log.Fatalf("reading %s: %v (%d requests)", *requests, err, len(reqs))
	}
	conns := make([]*grpc.ClientConn, *connections)
	for i := range conns {
		conns[i], err = grpc.NewClient(*target,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
		if err != nil {
			log.Fatal(err)
		}
	}
	ctxs, err := callContexts(*token, *tokens, len(reqs))
	if err != nil {
		log.Fatal(err)
	}

	var hostStreams map[string]*hostStream
	if *streams {
		hostStreams, err = openStreams(conns, ctxs, *method)
		if err != nil {
			log.Fatal(err)
		}
	}
	if *waitGo {
		for _, c := range conns {
			c.Connect()
		}
		fmt.Fprintln(os.Stderr, "ready")
		if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
			log.Fatalf("waiting for the start: %v", err)
		}
	}

	var next atomic.Int64
	var mu sync.Mutex
	codes := map[string]int{}
	messages := map[string]int{}
	var latencies []time.Duration
	var wg sync.WaitGroup
	// call sends request i on conn and records its latency, code and (for a failure) message.
	call := func(conn *grpc.ClientConn, i int) {
		req := reqs[i%len(reqs)]
		ctx := ctxs[i%len(ctxs)]
		if *timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, *timeout)
			defer cancel()
		}
		var resp []byte
		t0 := time.Now()
		var err error
		if hostStreams != nil {
			err = hostStreams[tokenOf(ctx)].send(&req, &resp)
		} else {
			err = conn.Invoke(ctx, *method, &req, &resp)
		}
		took := time.Since(t0)
		mu.Lock()
		latencies = append(latencies, took)
		code := status.Code(err).String()
		codes[code]++
		if err != nil {
			messages[code+": "+address.ReplaceAllString(status.Convert(err).Message(), "ADDR")]++
		}
		mu.Unlock()
	}
	start := time.Now()
	deadline := start.Add(*duration)
	if *rate > 0 {
		interval := time.Duration(float64(time.Second) / *rate)
		for k := 0; time.Now().Before(deadline); k++ {
			if wait := time.Until(start.Add(time.Duration(k) * interval)); wait > 0 {
				time.Sleep(wait)
			}
			wg.Add(1)
			go func(k int) {
				defer wg.Done()
				call(conns[k%len(conns)], k)
			}(k)
		}
	} else {
		for w := 0; w < *concurrency; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for time.Now().Before(deadline) {
					call(conns[w%len(conns)], int(next.Add(1)-1))
				}
			}(w)
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	out, _ := json.Marshal(summary{
		Calls:    len(latencies),
		Codes:    codes,
		Messages: messages,
		Seconds:  elapsed.Seconds(),
		P50Ms:    percentile(latencies, 50),
		P99Ms:    percentile(latencies, 99),
	})
	fmt.Println(string(out))
}

// hostStream is one host's long-lived stream: one request at a time, each answered before the
// next is sent. A stream that ended is opened again for the host's next request, as an agent
// would.
type hostStream struct {
	mu     sync.Mutex
	conn   *grpc.ClientConn
	ctx    context.Context
	method string
	stream grpc.ClientStream
}

var bidi = &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}

func (h *hostStream) send(req, resp *[]byte) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stream == nil {
		s, err := h.conn.NewStream(h.ctx, bidi, h.method)
		if err != nil {
			return err
		}
		h.stream = s
	}
	err := h.stream.SendMsg(req)
	if err == nil {
		err = h.stream.RecvMsg(resp)
	} else if rerr := h.stream.RecvMsg(resp); rerr != nil {
		err = rerr // io.EOF from SendMsg: the stream has ended, and RecvMsg says why
	}
	if err != nil {
		h.stream = nil
	}
	return err
}

func tokenOf(ctx context.Context) string {
	md, _ := metadata.FromOutgoingContext(ctx)
	return strings.Join(md.Get("authorization"), "")
}

// openStreams opens a stream per distinct token (host), spread over the connections.
func openStreams(conns []*grpc.ClientConn, ctxs []context.Context, method string) (map[string]*hostStream, error) {
	out := map[string]*hostStream{}
	for _, ctx := range ctxs {
		key := tokenOf(ctx)
		if _, ok := out[key]; ok {
			continue
		}
		conn := conns[len(out)%len(conns)]
		s, err := conn.NewStream(ctx, bidi, method)
		if err != nil {
			return nil, fmt.Errorf("opening stream %d: %w", len(out), err)
		}
		out[key] = &hostStream{conn: conn, ctx: ctx, method: method, stream: s}
	}
	return out, nil
}
