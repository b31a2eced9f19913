// Test worker: a TLS server from Go's standard library (crypto/tls, no libssl).
// argv: CERT KEY TAG. Prints its port; each connection handshakes, reads one
// HTTP/1.0 request and answers "ok". Each line on stdin prints the number of
// handshakes that completed so far: the reference count the probe must match.
package main

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"sync/atomic"
)

func main() {
	cert, err := tls.LoadX509KeyPair(os.Args[1], os.Args[2])
	if err != nil {
		panic(err)
	}
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	fmt.Println(listener.Addr().(*net.TCPAddr).Port)
	var handshakes int64
	config := &tls.Config{Certificates: []tls.Certificate{cert}}
	go func() {
		for {
			conn, err := listener.Accept()
			if err != nil {
				panic(err)
			}
			go func() {
				defer conn.Close()
				tlsConn := tls.Server(conn, config)
				if tlsConn.Handshake() != nil {
					return
				}
				atomic.AddInt64(&handshakes, 1)
				request := bufio.NewReader(tlsConn)
				for {
					line, err := request.ReadString('\n')
					if err != nil || line == "\r\n" || line == "\n" {
						break
					}
				}
				tlsConn.Write([]byte("HTTP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nok\n"))
			}()
		}
	}()
	lines := bufio.NewScanner(os.Stdin)
	for lines.Scan() {
		fmt.Println(atomic.LoadInt64(&handshakes))
	}
}
