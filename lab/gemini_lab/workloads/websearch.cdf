# The web-search flow-size distribution of DCTCP (Alizadeh et al., "Data Center TCP (DCTCP)",
# SIGCOMM 2010), as tabulated in alibaba-edu/High-Precision-Congestion-Control,
# traffic_gen/WebSearch_distribution.txt: the table DATAPATHS-SPEC.md names for the GEMINI
# paper's web-search FCT experiment (G9). One point a line: flow size in bytes, cumulative
# percentage of flows at or below it. Sizes between two points are drawn uniformly (the CDF
# interpolated linearly, as that repository's traffic generator draws them). Mean 1,711,250
# bytes; 54.2 % of flows are under 100 KB, 3 % over 10 MB.
0 0
10000 15
20000 20
30000 30
50000 40
80000 53
200000 60
1000000 70
2000000 80
5000000 90
10000000 97
30000000 100
