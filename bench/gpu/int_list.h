// int_list.h — "1,64,512" as {1, 64, 512}, for the GPU benchmarks' list flags. Throws
// std::invalid_argument / std::out_of_range (std::stoi) on a malformed item.
#pragma once

#include <sstream>
#include <string>
#include <vector>

inline std::vector<int> parse_int_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoi(item));
  return out;
}
