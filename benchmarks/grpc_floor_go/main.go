// Command grpc_floor_go is benchmarks.grpc_floor compiled: what grpc-go costs per call when it
// serves Booster's two agent calls the way Booster's Python server does, and nothing else.
//
// It answers ReportAggregates and GetParameters of --service with an empty message (and any
// other method with UNIMPLEMENTED, as Booster does) after the transport part of Booster's agent service: read the call's metadata, read its one
// message and the end of the stream under the receive deadline, answer. Messages stay bytes
// (a codec that neither parses nor builds protobuf), so the figure is gRPC's own: HTTP/2
// framing, flow control, the threads that wake for a call. The limits are Booster's
// (GrpcLimits), passed as flags by benchmarks.replicas so they have one source.
//
// It exists to answer one question with a measurement: would a compiled gRPC front bring
// Booster's CPU per report at a fleet's rate under the floor that Python's gRPC sets?
//
//	go build -o grpc_floor_go . && ./grpc_floor_go --listen 127.0.0.1:PORT
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// rawCodec hands each message over as the bytes on the wire, as Booster's handlers take them.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }

func (rawCodec) Unmarshal(data []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), data...)
	return nil
}

func (rawCodec) Name() string { return "proto" } // what clients send as the content subtype

// limits are the GrpcLimits fields the floor applies.
type limits struct {
	maxMessageBytes    int
	maxMetadataBytes   int
	maxStreamsPerConn  int
	receiveTimeout     time.Duration
	connectionIdle     time.Duration
	connectionAge      time.Duration
	connectionAgeGrace time.Duration
	handshakeTimeout   time.Duration
	minPingInterval    time.Duration
}

// serveCall reads the credential, the one message and the end of the stream within the
// receive deadline, and answers with an empty message.
func serveCall(lim limits, service string) grpc.StreamHandler {
	methods := map[string]bool{
		"/" + service + "/ReportAggregates": true,
		"/" + service + "/GetParameters":    true,
	}
	return func(_ any, stream grpc.ServerStream) error {
		if method, _ := grpc.MethodFromServerStream(stream); !methods[method] {
			return status.Errorf(codes.Unimplemented, "unknown method %s", method)
		}
		md, _ := metadata.FromIncomingContext(stream.Context())
		_ = md.Get("authorization")
		received := make(chan error, 1)
		go func() {
			var msg, extra []byte
			if err := stream.RecvMsg(&msg); err != nil {
				received <- err
				return
			}
			if err := stream.RecvMsg(&extra); !errors.Is(err, io.EOF) {
				received <- status.Error(codes.InvalidArgument, "one request message per call")
				return
			}
			received <- nil
		}()
		ctx, cancel := context.WithTimeout(stream.Context(), lim.receiveTimeout)
		defer cancel()
		select {
		case err := <-received:
			if err != nil {
				return err
			}
		case <-ctx.Done():
			return status.Error(codes.DeadlineExceeded, "request not received in time")
		}
		empty := []byte{}
		return stream.SendMsg(&empty)
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "host:port")
	service := flag.String("service", "gemini.booster.v1.Booster", "the agent service's full name")
	var lim limits
	flag.IntVar(&lim.maxMessageBytes, "max-message-bytes", 1<<20, "")
	flag.IntVar(&lim.maxMetadataBytes, "max-metadata-bytes", 16<<10, "")
	flag.IntVar(&lim.maxStreamsPerConn, "max-streams-per-connection", 32, "")
	flag.DurationVar(&lim.receiveTimeout, "receive-timeout", 10*time.Second, "")
	flag.DurationVar(&lim.connectionIdle, "connection-idle", 300*time.Second, "")
	flag.DurationVar(&lim.connectionAge, "connection-age", 600*time.Second, "")
	flag.DurationVar(&lim.connectionAgeGrace, "connection-age-grace", 30*time.Second, "")
	flag.DurationVar(&lim.handshakeTimeout, "handshake-timeout", 20*time.Second, "")
	flag.DurationVar(&lim.minPingInterval, "min-ping-interval", 30*time.Second, "")
	flag.Parse()
	encoding.RegisterCodec(rawCodec{})
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatalf("grpc_floor_go: cannot listen on %s: %v", *listen, err)
	}
	server := grpc.NewServer(
		grpc.UnknownServiceHandler(serveCall(lim, *service)),
		grpc.MaxRecvMsgSize(lim.maxMessageBytes),
		grpc.MaxHeaderListSize(uint32(lim.maxMetadataBytes)),
		grpc.MaxConcurrentStreams(uint32(lim.maxStreamsPerConn)),
		grpc.ConnectionTimeout(lim.handshakeTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle:     lim.connectionIdle,
			MaxConnectionAge:      lim.connectionAge,
			MaxConnectionAgeGrace: lim.connectionAgeGrace,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime:             lim.minPingInterval,
			PermitWithoutStream: true,
		}),
	)
	fmt.Println("serving")
	log.Fatal(server.Serve(lis))
}
